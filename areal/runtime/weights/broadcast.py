"""transport.weights=broadcast: the policy goes from the trainer's rank 0 to every generator over a process
group (engines/weight_group.py: NCCL on GPU, gloo on CPU), with no disk. The group forms when the trainer
starts, and its first broadcast is the weights the run starts from. A broadcast is a collective: the trainer
sends once the controller has told the generators, which take their part when told (`collective`).
No file exists, so the trainer writes the policy into each checkpoint itself.
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from areal.graph.roles import GroupMember
from areal.runtime.storage.checkpoint import policy_name
from areal.runtime.weights.transport import Source, Transport
from areal.runtime.wire.weight_update import Via

KIND = "broadcast"


class BroadcastPublisher:
    def __init__(self, source: Source) -> None:
        from areal.engines.weight_group import WeightGroup, group_device

        self.source = source
        self.group: WeightGroup | None = None
        weights = source.gather()  # every rank: gathering is a collective
        if not source.rank_follower:
            members = source.plan.weights_members()
            self.group = WeightGroup(source.plan.weights_rendezvous, 0, len(members),
                                     device=group_device(source.config.generation.engine))
            self.group.send(weights)
        self._gathered: dict[str, Tensor] | None = None

    def publish(self, version: int) -> Via | None:
        self._gathered = self.source.gather()
        return None if self.source.rank_follower else Via(KIND, weights=self.source.weights)

    def reported(self) -> None:
        if self.group is not None and self._gathered is not None:
            self.group.send(self._gathered)
        self._gathered = None

    def sent_bytes(self) -> None:
        return None

    def checkpoint(self, folder: Path) -> None:
        # no weights file to copy: the checkpoint's policy (export, resume) is written here
        self.source.save(None if self.source.rank_follower else str(folder / policy_name(self.source.model)))

    def close(self) -> None:
        pass


def receive(via: Via, follower: GroupMember, version: int) -> bool:
    """Take part in the trainer's broadcast of `version`."""
    follower.receive_weights(version)
    return True


TRANSPORT = Transport(publisher=BroadcastPublisher, receive=receive, collective=True)

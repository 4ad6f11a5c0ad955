"""One output channel of a pool: the fields the next pool reads, to the replica that should get them."""

from __future__ import annotations

from typing import Any

from areal.graph.batch import Batch
from areal.graph.meta import GroupMeta
from areal.runtime.compiler.plan import IMPLICIT, Channel, Plan
from areal.runtime.wire.channels import BatchSender, is_dynamic
from areal.runtime.wire.codec import encode
from areal.runtime.wire.security import RunKey


class Outbox:
    """Balanced channels deal batches to any replica (ZeroMQ's round robin); by-group ones send a group to the
    replica its number picks, so that every input of a joining pool brings it to the same one."""

    def __init__(self, channel: Channel, plan: Plan, key: RunKey | None) -> None:
        self.channel = channel
        self.limits = {"max_frame_bytes": plan.max_frame_bytes, "max_header_bytes": plan.max_header_bytes}
        dynamic = is_dynamic(channel.endpoints)  # Ray: the controller says where each replica listens
        count = 1 if channel.routing == "balance" else len(channel.endpoints)
        self.senders = [BatchSender(None, bind=False, key=key, **plan.sender_limits()) for _ in range(count)]
        if not dynamic:
            for replica, endpoint in enumerate(channel.endpoints):
                self.connect(replica, endpoint)

    def connect(self, replica: int, endpoint: str) -> None:
        self._sender(replica).connect(endpoint)

    def disconnect(self, replica: int, endpoint: str) -> None:
        self._sender(replica).disconnect(endpoint)

    def _sender(self, replica: int) -> BatchSender:
        return self.senders[0 if len(self.senders) == 1 else replica]

    def project(self, batch: Batch) -> Batch:
        """The fields this channel carries: what the next pool reads from this one, and the ids."""
        return Batch({name: batch[name] for name in (*self.channel.fields, *IMPLICIT)})

    def check(self, batch: Batch, meta: GroupMeta) -> None:
        """Raise FrameTooLarge now if this batch could never cross the channel."""
        encode(self.project(batch), meta.to_wire(), **self.limits)

    def send(self, batch: Batch, meta: GroupMeta, timeout_ms: int) -> None:
        sender = self.senders[abs(meta.group) % len(self.senders)]
        sender.send(self.project(batch), meta.to_wire(), timeout_ms=timeout_ms)

    def close(self) -> None:
        for sender in self.senders:
            sender.close()


def wire_message(channel: Channel, replica: int, endpoint: str, old: str | None) -> dict[str, Any]:
    """What the controller tells a sender when a replica of its channel's destination binds (Ray)."""
    return {"channel": channel.dst, "replica": replica, "connect": endpoint, "disconnect": old}

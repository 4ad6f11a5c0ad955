"""What a weights transport is: its publisher (trainer side), its receive (follower side) and its part
of a checkpoint. Each transport is one module of this package that builds a `Transport`; the table in
`__init__.py` names them, so a new way to move weights is one new file plus one line there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from torch import Tensor

from areal.config import RunConfig
from areal.runtime.compiler.plan import Plan
from areal.runtime.wire.weight_update import Via


@dataclass(frozen=True)
class Source:
    """What a publisher is given of the trainer it publishes for: where the run is, and the node's two ways
    out, each already guarded so a failure names the node."""

    model: str  # the trainer node
    plan: Plan
    config: RunConfig
    rank_follower: bool  # a trainer rank > 0: it only takes its part in gathering the weights
    gather: Callable[[], dict[str, Tensor]]  # the whole policy (FSDP: a collective on every rank)
    save: Callable[[str | None], None]  # the policy written to a file; None: only this rank's part of gathering
    weights: str = "full"  # what gather and save give: the whole policy, or a LoRA policy's adapters ("lora")

    @property
    def keep(self) -> int:
        """Versions a follower may still ask for: the newest three, and lagged mode's η older ones."""
        return 3 + self.config.sampling_lag


class Publisher(Protocol):
    def publish(self, version: int) -> Via | None:
        """Make `version` available to the followers; None on a rank follower (rank 0 reports it)."""
        ...

    def reported(self) -> None:
        """The controller has been told of the version (a broadcast sends it now: the followers join)."""
        ...

    def sent_bytes(self) -> int | None:
        """Bytes sent to followers over the network so far; None where the transport cannot count them (files and
        shared memory are read where they lie; a broadcast's bytes are gloo's)."""
        ...

    def checkpoint(self, folder: Path) -> None:
        """This transport's part of a checkpoint: the policy file, where no published file is copied."""
        ...

    def close(self) -> None:
        """The trainer stops: let go of whatever the followers no longer need."""
        ...


@dataclass(frozen=True)
class Transport:
    publisher: Callable[[Source], Publisher]
    receive: Callable[[Via, Any, int], bool]  # (via, the follower node, version): load it into the node; False
    # when a newer version superseded it before it could be read (that one's update is on its way)
    collective: bool = False  # a follower receives when told (the trainer waits in it), not when its loop may
    one_host: bool = False  # its followers read what the trainer left on its machine: they must run there

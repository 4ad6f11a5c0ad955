"""The controller's commands to a worker, one class per kind: the types are the list of what a worker is told.

They are messages like the workers' own (messages.py): the controller builds the class, the control socket
carries its `to_wire` map, and the worker `parse`s it once where it enters, so a malformed command stops
the worker with a reason naming the kind and the field instead of a KeyError in a loop. The worker
dispatches on the class (`COMMANDS` in worker/main.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from areal.runtime.wire.messages import Message, parse_kind
from areal.runtime.wire.weight_update import WeightUpdate


class Command(Message):
    """A message the controller sends to one worker."""


class Stop(Command):
    KIND: ClassVar[str] = "stop"
    checkpoint: str | None = None  # a trainer's exit checkpoint: the staging folder to write its part into


class Rewire(Command):
    KIND: ClassVar[str] = "peers"  # dynamic endpoints (Ray): where a replica of a pool this one sends to listens now
    channel: str  # the receiving pool
    replica: int
    connect: str
    disconnect: str | None = None  # the endpoint of the process it replaced


class TakeCensus(Command):
    KIND: ClassVar[str] = "census"  # a trainer answers with what it holds (messages.Census), once it drained its inputs
    seq: int


class ForgetBelow(Command):
    KIND: ClassVar[str] = "frontier"  # every trainer consumed the groups below `group`: a join lets them go
    group: int


class HoldWeights(Command):
    KIND: ClassVar[str] = "weights"  # the version of a model a follower is to hold now, and how it travels
    update: WeightUpdate


class EndTraining(Command):
    KIND: ClassVar[str] = "end-training"  # max_minutes: a trainer takes no further step and says where it ended


KINDS: dict[str, type[Command]] = {cls.KIND: cls for cls in (Stop, Rewire, TakeCensus, ForgetBelow, HoldWeights,
                                                              EndTraining)}


def parse(raw: Mapping[str, Any]) -> Command:
    """The command the controller sent, checked field by field; WireError says what is wrong."""
    return parse_kind(raw, KINDS, "command", "the controller")

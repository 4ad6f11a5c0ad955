"""The control plane's messages, one class per kind: the types are the list of what workers say to the
controller (the controller's commands to workers are in commands.py, on the same base).

A sender builds the class; it crosses the control socket as a msgpack map with a "type" (`to_wire`);
`parse` turns the map back into its class, checking every field where it enters, so a malformed
message is refused with a reason that names the sender, the kind and the field (never a KeyError
deep in a handler). The controller dispatches on the class (`HANDLERS` in controller.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from areal.errors import WireError
from areal.runtime.wire.weight_update import Via


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    KIND: ClassVar[str] = ""

    def to_wire(self) -> dict[str, Any]:
        """The map the control socket carries: the kind, and each field not at its default (`parse` restores it)."""
        return {"type": self.KIND, **self.model_dump(exclude_defaults=True)}


M = TypeVar("M", bound=Message)


# -- worker -> controller ---------------------------------------------------------------------------


class Alive(Message):
    KIND: ClassVar[str] = "pulse"  # from a worker's pulse thread (control.Pulse)
    long_call: str = ""  # the node call its main thread has been in for long (chain.LongCalls); "" when none


class Ready(Message):
    KIND: ClassVar[str] = "ready"
    pid: int
    endpoints: dict[str, str] = {}  # input channel (the sending pool) -> the endpoint this worker bound


class Heartbeat(Message):
    KIND: ClassVar[str] = "heartbeat"
    busy: float = 0.0
    cpu_s: float = 0.0  # CPU seconds of the worker and every process it started, so far (cpu_usage.py)
    holding: list[int] = []  # groups a trainer gathered for coming steps (not re-issued after a crash)
    batches: int = 0
    samples: int = 0
    tokens: int = 0


class Census(Message):
    KIND: ClassVar[str] = "census"  # a trainer's answer to "census": what it holds once it drained its inputs
    seq: int
    holding: list[int] = []


class Stopped(Message):
    KIND: ClassVar[str] = "stopped"
    cpu_s: float = 0.0  # as Heartbeat's, at the end
    batches: int = 0
    samples: int = 0
    tokens: int = 0


class VersionPublished(Message):
    KIND: ClassVar[str] = "version"
    model: str  # the trainer node, whose model has a new version
    version: int
    via: Via | None = None  # how the new weights travel (None from a trainer rank's part of a step)
    stats: dict[str, Any] = {}
    staleness: dict[str, int] = {}
    groups: list[int] = []  # the groups the step consumed, in order (empty ones too)
    next_group: int = 0
    sample_ids: list[int] = []
    rewards: list[float] = []
    solved: list[bool] = []  # per trained sample, by eval.solved (runtime/records/solved.py)
    tokens: int = 0


class TrainingEnded(Message):
    KIND: ClassVar[str] = "training-ended"  # a trainer told to end (max_minutes) took its last step: this one
    model: str
    version: int


class SamplesFailed(Message):
    KIND: ClassVar[str] = "failed"
    node: str
    sample_ids: list[int]
    reasons: list[str]
    eval: bool = False


class SamplesFiltered(Message):
    KIND: ClassVar[str] = "filtered"
    node: str
    sample_ids: list[int]
    reasons: list[str]


class SamplesDropped(Message):
    KIND: ClassVar[str] = "dropped"  # a staleness policy's: too old to train within η (staleness_policy=drop)
    node: str
    sample_ids: list[int]
    tokens: list[int]  # output tokens each had generated: wasted
    reason: str = ""


class GroupsRecycled(Message):
    KIND: ClassVar[str] = "recycled"  # staleness_policy=recycle: re-queued in their generator, still in flight
    node: str
    version: int  # the generator's version: each group's new stamp
    groups: list[int]
    tokens: list[int]  # output tokens each group's re-queued samples carried back to the queue


class SamplesNoted(Message):
    KIND: ClassVar[str] = "noted"  # an over-long or empty generation: counted, and it trains on
    node: str = ""
    sample_ids: list[int]
    reasons: list[str]


class HeldOutScored(Message):
    KIND: ClassVar[str] = "eval"
    round: int
    task_ids: list[str] = []
    rewards: list[float] = []
    solved: list[bool] = []
    sample_ids: list[int] = []


class CheckpointWritten(Message):
    KIND: ClassVar[str] = "checkpoint"
    model: str
    version: int
    path: str
    next_group: int = 0
    consumed: list[int] = []  # groups above next_group the trainer consumed (a policy that trains out of order)


class FileWritten(Message):
    KIND: ClassVar[str] = "file"  # a piece of a file written in a worker's copy of the run directory (storage/mirror)
    path: str  # relative to the run directory
    data: bytes = b""
    fresh: bool = False  # the file starts with this piece


class DuplicateDropped(Message):
    KIND: ClassVar[str] = "duplicate"
    group: int


class BatchRefused(Message):
    KIND: ClassVar[str] = "rejected"
    groups: list[int] = []
    reason: str = ""


class NodeMetrics(Message):
    KIND: ClassVar[str] = "metrics"
    values: dict[str, float]
    node: str | None = None  # the node that reported them (a trainer's own stats come untagged)


class WorkerError(Message):
    KIND: ClassVar[str] = "error"
    node: str | None = None
    message: str = ""
    traceback: str = ""
    fatal: bool = False


KINDS: dict[str, type[Message]] = {cls.KIND: cls for cls in (
    Alive, Ready, Heartbeat, Census, Stopped, VersionPublished, SamplesFailed, SamplesFiltered, SamplesDropped,
    GroupsRecycled, SamplesNoted, HeldOutScored, CheckpointWritten, FileWritten, DuplicateDropped, BatchRefused,
    NodeMetrics, WorkerError, TrainingEnded)}


def parse(raw: Mapping[str, Any], sender: str) -> Message:
    """The message a worker sent, checked field by field; WireError says what is wrong."""
    return parse_kind(raw, KINDS, "control message", sender)


def parse_kind(raw: Mapping[str, Any], kinds: Mapping[str, type[M]], what: str, sender: str) -> M:
    """`raw` as the class its "type" names in `kinds`; WireError names `what` came from whom, its kind and field."""
    kind = raw.get("type")
    cls = kinds.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise WireError(f"{what} from {sender}: unknown type {kind!r} (known: {', '.join(kinds)})")
    try:
        return cls.model_validate({k: v for k, v in raw.items() if k != "type"})
    except ValidationError as err:
        problem = err.errors()[0]
        where = ".".join(str(p) for p in problem["loc"])
        raise WireError(f"{what} '{kind}' from {sender}: {where}: {problem['msg']}") from None

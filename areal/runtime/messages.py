"""The control plane's messages, one class per kind: the types are the list of what workers and the
controller say to each other.

A message crosses the control socket as a msgpack map with a "type"; `parse` turns the map back
into its class, checking every field where it enters, so a malformed message is refused with a
reason that names the sender, the kind and the field (never a KeyError deep in a handler). The
controller dispatches on the class (`HANDLERS` in controller.py).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from areal.errors import WireError


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    KIND: ClassVar[str] = ""

    def fields(self) -> dict[str, Any]:
        """What `ControlClient.send(kind, **fields)` puts on the wire."""
        return self.model_dump()


# -- worker -> controller ---------------------------------------------------------------------------


class Ready(Message):
    KIND: ClassVar[str] = "ready"
    pid: int
    endpoints: dict[str, str] = {}  # input channel (the sending pool) -> the endpoint this worker bound


class Heartbeat(Message):
    KIND: ClassVar[str] = "heartbeat"
    busy: float = 0.0
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
    batches: int = 0
    samples: int = 0
    tokens: int = 0


class VersionPublished(Message):
    KIND: ClassVar[str] = "version"
    model: str  # the trainer node, whose model has a new version
    version: int
    path: str | None = None  # its weights file (transport.weights=files)
    broadcast: bool = False  # the trainer waits in the weights group's broadcast of this version
    stats: dict[str, Any] = {}
    staleness: dict[str, int] = {}
    groups: list[int] = []  # the groups the step consumed, in order (empty ones too)
    next_group: int = 0
    sample_ids: list[int] = []
    rewards: list[float] = []
    solved: list[bool] = []  # per trained sample, by eval.solved (runtime/solved.py)
    tokens: int = 0


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


class WorkerError(Message):
    KIND: ClassVar[str] = "error"
    node: str | None = None
    message: str = ""
    traceback: str = ""
    fatal: bool = False


KINDS: dict[str, type[Message]] = {cls.KIND: cls for cls in (
    Ready, Heartbeat, Census, Stopped, VersionPublished, SamplesFailed, SamplesFiltered, SamplesNoted, HeldOutScored,
    CheckpointWritten, DuplicateDropped, BatchRefused, NodeMetrics, WorkerError)}


def parse(raw: dict[str, Any], sender: str) -> Message:
    """The message a worker sent, checked field by field; WireError says what is wrong."""
    kind = raw.get("type")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise WireError(f"control message from {sender}: unknown type {kind!r} (known: {', '.join(KINDS)})")
    try:
        return cls.model_validate({k: v for k, v in raw.items() if k != "type"})
    except ValidationError as err:
        problem = err.errors()[0]
        where = ".".join(str(p) for p in problem["loc"])
        raise WireError(f"control message '{kind}' from {sender}: {where}: {problem['msg']}") from None

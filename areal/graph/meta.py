"""What travels with a batch besides its fields: which group it is and how the runtime treats it.

A `GroupMeta` is made by the controller when it admits a group (or a held-out round) and read
by every worker on the way. It crosses sockets as a plain map; `from_wire` checks that map where
it enters, so a frame without the meta a worker needs is refused with a reason that names the
sender and the key, never a KeyError deep inside a loop.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from areal.errors import WireError


@dataclass(frozen=True)
class GroupMeta:
    group: int  # the admission number of the (first) group in the batch; held-out groups are negative
    samples: int  # samples to generate per prompt: G for training, 1 for held-out rounds
    admitted_at: int  # the policy version the generator must hold before it samples the group
    slot: int | None = None  # its rank among the groups holding a staleness slot when it started (0-based)
    eval: bool = False  # a held-out round: scored, never trained
    round: int | None = None  # the held-out round's number
    task_ids: tuple[str, ...] = field(default_factory=tuple)  # held-out: each prompt's task id, in order
    # the generator's version when it started the group, or last re-queued it (staleness_policy=recycle)
    stamped_at: int | None = None
    # the generator that samples it (its worker id, "rollout[0]"), stamped as it starts: the mismatch alarm names it
    sampled_by: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_wire(cls, raw: Any, sender: str) -> GroupMeta:
        """The meta a peer sent, checked key by key; WireError names the sender and what is wrong."""
        if not isinstance(raw, dict):
            raise WireError(f"from {sender}: the batch's meta must be a map, got {type(raw).__name__}")
        unknown = sorted(set(raw) - set(cls.__dataclass_fields__))
        if unknown:
            raise WireError(f"from {sender}: unknown meta keys {unknown}")
        for key in ("group", "samples", "admitted_at"):
            if key not in raw:
                raise WireError(f"from {sender}: the batch's meta has no '{key}' (it has: {sorted(raw) or 'nothing'})")
        for key in ("group", "samples", "admitted_at", "round", "slot", "stamped_at"):
            value = raw.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise WireError(f"from {sender}: meta '{key}' must be an int, got {type(value).__name__}")
        if raw["samples"] < 1 or raw["admitted_at"] < 0:
            raise WireError(f"from {sender}: meta 'samples' must be >= 1 and 'admitted_at' >= 0, "
                            f"got {raw['samples']} and {raw['admitted_at']}")
        if not isinstance(raw.get("eval", False), bool):
            raise WireError(f"from {sender}: meta 'eval' must be true or false")
        if not isinstance(raw.get("sampled_by", ""), (str, type(None))):
            raise WireError(f"from {sender}: meta 'sampled_by' must be a worker id (str)")
        task_ids = raw.get("task_ids", [])
        if not isinstance(task_ids, list) or not all(isinstance(t, str) for t in task_ids):
            raise WireError(f"from {sender}: meta 'task_ids' must be a list of str")
        if raw.get("eval") and raw.get("round") is None:
            raise WireError(f"from {sender}: a held-out batch's meta needs its 'round'")
        return cls(raw["group"], raw["samples"], raw["admitted_at"], raw.get("slot"), bool(raw.get("eval", False)),
                   raw.get("round"), tuple(task_ids), raw.get("stamped_at"), raw.get("sampled_by"))

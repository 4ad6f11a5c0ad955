"""Where every sample is: started, trained, failed (with reason), or still in flight.

The invariant checked at every trainer step: each sample of a closed batch (groups below
version·B) was trained or failed, exactly once. A duplicate trained id is counted and dropped.
A generation that is over-long (it hit max_new_tokens) or empty is noted by its generator: it
still trains (it earns its reward like any other), and the notes are counted once per sample id.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from areal.errors import RunError


@dataclass
class Accounting:
    batch_size: int  # groups per step
    group_size: int  # samples per group
    started_groups: int = 0
    trained: set[int] = field(default_factory=set)
    failed: dict[int, str] = field(default_factory=dict)
    duplicates: int = 0
    reissued: int = 0
    fail_reasons: Counter[str] = field(default_factory=Counter)
    noted: dict[int, str] = field(default_factory=dict)  # sample id -> "over_long" or "empty"

    @property
    def started(self) -> int:
        return self.started_groups * self.group_size

    def on_trained(self, sample_ids: list[int]) -> None:
        for sid in sample_ids:
            if sid in self.trained:
                self.duplicates += 1
            self.trained.add(sid)
            self.failed.pop(sid, None)  # a re-issued copy succeeded where an earlier attempt failed

    def on_failed(self, sample_ids: list[int], reasons: list[str]) -> None:
        for sid, reason in zip(sample_ids, reasons):
            if sid not in self.failed and sid not in self.trained:
                self.failed[sid] = reason
                self.fail_reasons[reason.split(":")[0]] += 1

    def on_noted(self, sample_ids: list[int], reasons: list[str]) -> None:
        for sid, reason in zip(sample_ids, reasons):
            self.noted.setdefault(sid, reason)  # a regenerated sample is the same sample

    def in_flight(self, version: int) -> int:
        closed = version * self.batch_size * self.group_size
        open_failed = sum(1 for sid in self.failed if sid >= closed)
        return self.started - closed - open_failed

    def check(self, version: int) -> None:
        """Every sample of groups below version·B is trained or failed, none both."""
        closed = version * self.batch_size * self.group_size
        trained = sum(1 for sid in self.trained if sid < closed)
        failed = sum(1 for sid in self.failed if sid < closed)
        both = len(self.trained & self.failed.keys())
        if trained + failed != closed or both:
            raise RunError(
                f"accounting broken at version {version}: {closed} samples in closed batches, "
                f"{trained} trained + {failed} failed ({both} both)"
            )

    def summary(self, version: int) -> dict[str, int]:
        return {
            "started": self.started,
            "trained": len(self.trained),
            "failed": len(self.failed),
            "in_flight": self.in_flight(version),
            "duplicates_dropped": self.duplicates,
            "reissued": self.reissued,
            "over_long": sum(1 for r in self.noted.values() if r == "over_long"),
            "empty": sum(1 for r in self.noted.values() if r == "empty"),
        }

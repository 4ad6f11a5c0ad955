"""Admission control for the source.

A trajectory (a prompt group) may start only while floor((N - 1) / B) <= i + η, where N counts
it among all started so far and i is the trainer's current version. The trainer forms batch k
from exactly the groups numbered [kB, (k+1)B), so a group numbered N-1 is trained at version
k = floor((N-1)/B) <= i_start + η: nothing trained is more than η versions behind, even when
generation is interrupted and resumed on newer weights. This module only decides; the
controller enforces the decision and the trainer re-checks every sample it consumes.
"""

from __future__ import annotations

from collections import Counter


class StalenessGate:
    """Counts started groups; `try_start(version)` says whether one more may start."""

    def __init__(self, batch_size: int, staleness: int, started: int = 0) -> None:
        if batch_size < 1 or staleness < 0:
            raise ValueError(f"batch_size must be >= 1 and staleness >= 0, got {batch_size}, {staleness}")
        self.batch_size = batch_size
        self.staleness = staleness
        self.started = started  # after a resume at version i this restarts at i·B, never at the old count

    def allows(self, version: int) -> bool:
        # N = started + 1 is the group about to start
        return self.started // self.batch_size <= version + self.staleness

    def try_start(self, version: int) -> bool:
        if not self.allows(version):
            return False
        self.started += 1
        return True

    def capacity(self, version: int) -> int:
        """How many more groups may start now: (η + i + 1)·B − started."""
        return max(0, (self.staleness + version + 1) * self.batch_size - self.started)

    @staticmethod
    def batch_of(group_id: int, batch_size: int) -> int:
        """The trainer step (= policy version it trains at) that consumes group `group_id`."""
        return group_id // batch_size


def staleness_histogram(trainer_version: int, min_versions: list[int]) -> Counter[int]:
    """How many samples were trained at each lag i - min(versions)."""
    return Counter(trainer_version - v for v in min_versions)

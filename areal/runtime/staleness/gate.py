"""Admission control for the source.

A trajectory (a prompt group) may start only while floor((N - 1) / B) <= i + η, where N counts
it among the groups started so far that still hold a slot (a group a filter dropped whole, or
whose every sample failed, frees its slot) and i is the slowest trainer's version. Trainers take
groups in admission order, skipping the freed ones, B per step, so a group ranked N-1 among the
slot holders is trained at version floor((N-1)/B) <= i_start + η: nothing trained is more than η
versions behind, even when generation is interrupted and resumed on newer weights (the strict
staleness policy; runtime/staleness/policies/ holds it and the others, which keep this gate and treat late
groups differently; `drop`, whose abort bounds its lag, may let `drop_slack` more groups start).
This module only decides; the controller enforces the decision and the trainer re-checks every sample.
"""

from __future__ import annotations


class StalenessGate:
    """Counts started groups and those freed (dropped whole by a filter, or every sample failed).

    `try_start(version)` says whether one more may start: N below counts the groups that still
    hold a slot (started minus freed), so a freed group lets the source refill its batch.
    """

    def __init__(self, batch_size: int, staleness: int, started: int = 0, freed: int = 0, slack: int = 0) -> None:
        """`slack`: groups admitted past the bound, for the drop policy, whose abort (not this gate) bounds the lag."""
        if batch_size < 1 or staleness < 0 or slack < 0:
            raise ValueError(f"batch_size must be >= 1, staleness and slack >= 0, got {batch_size}, {staleness}, "
                             f"{slack}")
        self.batch_size = batch_size
        self.staleness = staleness
        self.started = started  # after a resume at version i: the trainers' next group, never the old count
        self.freed = freed
        self.slack = slack

    def allows(self, version: int) -> bool:
        # N = started - freed + 1 is the group about to start; the first `slack` slots are extra
        return (self.started - self.freed - self.slack) // self.batch_size <= version + self.staleness

    def try_start(self, version: int) -> bool:
        if not self.allows(version):
            return False
        self.started += 1
        return True

    def free(self) -> None:
        """A group will never be trained (filtered whole, or failed): its slot goes to another."""
        self.freed += 1

    def capacity(self, version: int) -> int:
        """How many more groups may start now: (η + i + 1)·B + slack − (started − freed)."""
        return max(0, (self.staleness + version + 1) * self.batch_size + self.slack - (self.started - self.freed))

    @staticmethod
    def batch_of(group_id: int, batch_size: int) -> int:
        """The trainer step (= policy version it trains at) that consumes group `group_id`, when no group is freed."""
        return group_id // batch_size

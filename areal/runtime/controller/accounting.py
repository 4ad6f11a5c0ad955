"""Where every sample is: started, trained, failed, filtered, dropped (each with reason), or still in flight.

The invariant, checked at every trainer step: each sample of a group the trainers consumed was
trained, failed, filtered or dropped (by the staleness policy: too old to train within η),
exactly once; so started = trained + failed + filtered + dropped + in flight.
A group re-queued in its generator (staleness_policy=recycle) is still in flight: the re-queues
are counted beside the identity (`recycled`, and the tokens they carried), never in it.
A failure report leaves its worker before the rest of the group does, but on the worker's own
control socket, so the trainer's version can reach the controller first: a consumed sample with
no verdict yet waits for its report a grace period (the silence after which a worker counts as
dead) before the check fails.
With several trainers each trains every sample, and "trained" counts the samples the policy's
trainer (the one whose model generated them) trained; every trainer's own duplicates are dropped
and counted. A generation that is over-long (it hit max_new_tokens) or empty is noted by its
generator: it still trains, and the notes are counted once per sample id.
A group that can no longer reach a trainer frees its staleness slot once: a re-issued copy of it,
failed or filtered again, reports its samples again, and the gate must not count the slot twice.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from areal.errors import RunError


@dataclass
class Accounting:
    group_size: int  # samples per group
    counted: str = ""  # the trainer whose trained samples are counted (the sampled policy's)
    started_groups: int = 0
    trained: set[int] = field(default_factory=set)
    failed: dict[int, str] = field(default_factory=dict)
    filtered: dict[int, str] = field(default_factory=dict)
    dropped: dict[int, str] = field(default_factory=dict)  # by the staleness policy
    dropped_tokens: int = 0  # output tokens the dropped samples had generated (wasted)
    copy_tokens: int = 0  # output tokens of re-issued copies dropped after their sample was decided (wasted too)
    recycled: int = 0  # groups re-queued in their generator (staleness_policy=recycle): in flight, not a verdict
    recycled_tokens: int = 0  # output tokens their re-queued samples carried back to the queue
    duplicates: int = 0
    reissued: int = 0
    fail_reasons: Counter[str] = field(default_factory=Counter)
    noted: dict[int, str] = field(default_factory=dict)  # sample id -> "over_long" or "empty"
    consumed: set[int] = field(default_factory=set)  # groups every trainer has taken (the step's, empty ones too)
    awaiting: dict[int, tuple[int, float]] = field(default_factory=dict)  # consumed, no verdict yet: (version, when)
    lost: set[int] = field(default_factory=set)  # groups whose slot was freed (every sample failed or filtered)

    @property
    def started(self) -> int:
        return self.started_groups * self.group_size

    def samples_of(self, group: int) -> range:
        return range(group * self.group_size, (group + 1) * self.group_size)

    def decided(self, sid: int) -> bool:
        """Whether the sample has its verdict: trained, failed, filtered or dropped."""
        return sid in self.trained or sid in self.failed or sid in self.filtered or sid in self.dropped

    def on_trained(self, trainer: str, sample_ids: list[int]) -> None:
        if self.counted and trainer != self.counted:
            return
        for sid in sample_ids:
            if sid in self.trained:
                self.duplicates += 1
            self.trained.add(sid)
            self.awaiting.pop(sid, None)
            self.failed.pop(sid, None)  # a re-issued copy succeeded where an earlier attempt failed
            self.filtered.pop(sid, None)
            self.dropped.pop(sid, None)

    def on_failed(self, sample_ids: list[int], reasons: list[str]) -> list[int]:
        """Record failures; return the groups none of whose samples can still reach a trainer (their slot frees)."""
        for sid, reason in zip(sample_ids, reasons):
            self.awaiting.pop(sid, None)
            if not self.decided(sid):
                self.failed[sid] = reason
                self.fail_reasons[reason.split(":")[0]] += 1
        return self._lost_groups(sample_ids)

    def on_filtered(self, sample_ids: list[int], reasons: list[str]) -> list[int]:
        """Record a filter's drops; return the groups it dropped whole (their staleness slot frees)."""
        for sid, reason in zip(sample_ids, reasons):
            self.awaiting.pop(sid, None)
            if not self.decided(sid):
                self.filtered[sid] = reason
        return self._lost_groups(sample_ids)

    def on_dropped(self, sample_ids: list[int], tokens: list[int], reason: str) -> list[int]:
        """Record the staleness policy's drops and the tokens they wasted; return the groups lost whole."""
        for sid, count in zip(sample_ids, tokens):
            self.awaiting.pop(sid, None)
            if not self.decided(sid):
                self.dropped[sid] = reason
                self.dropped_tokens += count
            else:
                self.copy_tokens += count
        return self._lost_groups(sample_ids)

    def on_recycled(self, groups: list[int], tokens: list[int]) -> None:
        """Count re-queues: a group may be re-queued again, and stays in flight until its verdict."""
        self.recycled += len(groups)
        self.recycled_tokens += sum(tokens)

    def _lost_groups(self, sample_ids: list[int]) -> list[int]:
        """The groups of `sample_ids` that just lost their last sample: each is returned once, ever."""
        groups = sorted({sid // self.group_size for sid in sample_ids if sid >= 0} - self.lost)
        gone = self.failed.keys() | self.filtered.keys() | self.dropped.keys()
        newly = [g for g in groups if all(s in gone for s in self.samples_of(g))]
        self.lost.update(newly)
        return newly

    def on_noted(self, sample_ids: list[int], reasons: list[str]) -> None:
        for sid, reason in zip(sample_ids, reasons):
            self.noted.setdefault(sid, reason)  # a regenerated sample is the same sample

    def on_consumed(self, groups: list[int]) -> None:
        self.consumed.update(groups)

    def in_flight(self) -> int:
        return self.started - len(self.trained) - len(self.failed) - len(self.filtered) - len(self.dropped)

    def check(self, version: int, groups: list[int], now: float, grace_s: float) -> None:
        """Every sample of the groups a step consumed is trained, failed, filtered or dropped, none two of them; one
        with no verdict yet may wait `grace_s` for its report (module doc)."""
        for group in groups:
            for sid in self.samples_of(group):
                if not self.decided(sid):
                    self.awaiting.setdefault(sid, (version, now))
        both = sum(len(self.trained & other.keys()) for other in (self.failed, self.filtered, self.dropped))
        if both:
            raise RunError(f"accounting broken at version {version}: {both} samples counted both trained and "
                           f"failed, filtered or dropped")
        self.overdue(now, grace_s)

    def overdue(self, now: float, grace_s: float) -> None:
        """Raise when a consumed sample has waited longer than `grace_s` for a verdict: it was lost."""
        late = sorted(sid for sid, (_, when) in self.awaiting.items() if now - when > grace_s)
        if late:
            version = min(self.awaiting[sid][0] for sid in late)
            raise RunError(f"accounting broken at version {version}: {len(late)} samples of consumed groups neither "
                           f"trained, failed, filtered nor dropped {grace_s:g} s later (first: {late[:5]})")

    def summary(self) -> dict[str, int]:
        return {
            "started": self.started,
            "trained": len(self.trained),
            "failed": len(self.failed),
            "filtered": len(self.filtered),
            "dropped": len(self.dropped),
            "dropped_tokens": self.dropped_tokens,
            "copy_tokens": self.copy_tokens,
            "recycled": self.recycled,
            "recycled_tokens": self.recycled_tokens,
            "in_flight": self.in_flight(),
            "duplicates_dropped": self.duplicates,
            "reissued": self.reissued,
            "over_long": sum(1 for r in self.noted.values() if r == "over_long"),
            "empty": sum(1 for r in self.noted.values() if r == "empty"),
        }

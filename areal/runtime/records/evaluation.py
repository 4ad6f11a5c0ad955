"""Held-out rounds: the same tasks every round, so pass@1 compares across versions.

A round sends every held-out task `eval.samples` times, each copy its own one-sample group with a
negative id (kept apart from training ids: round r, copy i has group -(r·ROUND_IDS + i) - 1), through
the whole graph in chunks of whole tasks, about CHUNK_SAMPLES samples each. Filters pass them untouched,
trainers never train them, and the policy's trainer reports each sample's reward; the round ends when
every sample is scored or failed. Chunks, not one batch: a generator returns a batch only when all of
it is done, so one batch of the round left the reward pool idle until the last sample was written and
then held every training group behind its scoring, and a pool of generators got it all on one member
(its balanced channel now deals the chunks out; a joining pool's by-group channel still sends a round's
chunks by their first group id, so they need not spread evenly).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from areal.errors import source_errors
from areal.graph.batch import Batch
from areal.graph.meta import GroupMeta
from areal.runtime.records.learning import pass_at_1_error

log = logging.getLogger("areal.controller")
ROUND_IDS = 1_000_000  # held-out sample ids of one round (the config caps tasks x samples below it)
CHUNK_SAMPLES = 16  # a chunk of a round holds this many samples, or one task's when it has more


@dataclass
class Round:
    version: int
    n: int
    chunks: list[tuple[Batch, GroupMeta]]
    rewards: dict[int, float] = field(default_factory=dict)
    solved: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    started: float = field(default_factory=time.monotonic)

    @property
    def answered(self) -> set[int]:
        """The samples scored or failed (a re-sent one may have done both)."""
        return self.rewards.keys() | self.failed

    @property
    def done(self) -> bool:
        # checked on every chunk's report: count the failed apart, usually none, rather than build the union
        return len(self.rewards) + len(self.failed - self.rewards.keys()) >= self.n


class HeldOut:
    def __init__(self, tasks: list[dict[str, Any]], samples: int, first_round: int = 0) -> None:
        self.tasks = [task for task in tasks for _ in range(samples)]
        self.samples = samples
        self.next_round = first_round
        self.pending: dict[int, Round] = {}

    def start(self, version: int, task_batch: Any) -> list[tuple[Batch, GroupMeta]]:
        """A new round at `version` (the policy the generators sample): its chunks (batch and meta), to send."""
        round_id = self.next_round
        self.next_round += 1
        size = self.samples * max(1, CHUNK_SAMPLES // self.samples)
        chunks = []
        for first in range(0, len(self.tasks), size):
            tasks = self.tasks[first:first + size]
            groups = [-(round_id * ROUND_IDS + i) - 1 for i in range(first, first + len(tasks))]
            meta = GroupMeta(group=groups[0], samples=1, admitted_at=version, eval=True, round=round_id,
                             task_ids=tuple(str(t.get("task_id", i)) for i, t in enumerate(tasks, start=first)))
            chunks.append((task_batch(tasks, groups), meta))
        self.pending[round_id] = Round(version, len(self.tasks), chunks)
        return chunks

    def scored(self, round_id: int, sample_ids: list[int], rewards: list[float],
               solved: list[bool]) -> dict[str, Any] | None:
        """A round's scored samples: their rewards, and whether each is solved (eval.solved,
        runtime/records/solved.py)."""
        pending = self.pending.get(round_id)
        if pending is None:
            return None
        pending.rewards.update((int(s), float(r)) for s, r in zip(sample_ids, rewards))
        pending.solved.update(int(s) for s, ok in zip(sample_ids, solved) if ok)
        return self._finish(round_id)

    def failed(self, sample_ids: list[int]) -> list[dict[str, Any]]:
        records = []
        for sid in sample_ids:
            round_id = (-sid - 1) // ROUND_IDS
            if round_id in self.pending:
                self.pending[round_id].failed.add(sid)
                record = self._finish(round_id)
                if record is not None:
                    records.append(record)
        return records

    def _finish(self, round_id: int) -> dict[str, Any] | None:
        pending = self.pending[round_id]
        if not pending.done:
            return None
        del self.pending[round_id]
        rewards = list(pending.rewards.values())
        passed = len(pending.solved)
        tasks = pending.n // self.samples
        per_task = [0] * tasks  # copy i of the round is task i // samples (the order `start` dealt them in)
        for sid in pending.solved:
            per_task[(-sid - 1 - round_id * ROUND_IDS) // self.samples] += 1
        return {"kind": "eval", "round": round_id, "version": pending.version, "tasks": tasks,
                "samples": pending.n, "pass@1": passed / max(pending.n, 1),
                "pass@1_se": pass_at_1_error(per_task, self.samples),
                "reward_mean": sum(rewards) / max(pending.n, 1), "reward_max": max(rewards, default=None),
                "failed": len(pending.failed)}

    def in_flight(self) -> list[tuple[Batch, GroupMeta]]:
        """The chunks of unfinished rounds with a sample neither scored nor failed (to send again after a crash)."""
        unsent = []
        for r in self.pending.values():
            answered = r.answered
            unsent += [(batch, meta) for batch, meta in r.chunks if not set(batch["group_id"].tolist()) <= answered]
        return unsent


def first_pass(source: Any, n: int) -> list[dict[str, Any]]:
    """Up to n tasks of a held-out source, one pass at most: sources replay epochs, so stop where the next begins.

    A source without an `epoch` counter is read until a task_id repeats. Held-out tasks that share a task_id
    are all kept (each is scored), with a warning naming the id: they are probably a mistake in the file.
    """
    tasks: list[dict[str, Any]] = []
    seen: set[str] = set()
    repeated: list[str] = []
    with source_errors("the held-out task source"):
        iterator = iter(source)
        first_epoch = getattr(source, "epoch", None)
        for task in islice(iterator, n):
            if first_epoch is not None and source.epoch != first_epoch:
                break
            key = str(task.get("task_id", len(tasks)))
            if key in seen:
                if first_epoch is None:
                    break
                repeated.append(key)
            seen.add(key)
            tasks.append(task)
    if repeated:
        log.warning("held-out tasks repeat task_id %s (%s): each is scored, but the ids no longer name one task",
                    ", ".join(map(repr, repeated[:5])), source)
    return tasks

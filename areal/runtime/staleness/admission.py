"""The source behind the staleness gate: which group starts next, and everything started but not yet consumed.

Groups are numbered in admission order. A group is one task record as a one-row batch (its
source fields, with `group_id` and `sample_id` both the group number); it is kept until every
trainer has consumed it, so a crash anywhere downstream can be answered by sending it again
(`reissue`). The source's cursor is snapshotted before each group starts, so a checkpoint can
name the exact point a resumed run continues from. A record that could never cross the wire, or
that the source itself found malformed, is skipped, counted and named: it never starts a group.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch

from areal.config import RunConfig
from areal.errors import RunError, source_errors
from areal.graph.batch import Batch
from areal.graph.meta import GroupMeta
from areal.graph.node import Node
from areal.graph.roles import ConfiguredSource, ResumableSource
from areal.runtime.compiler.plan import Plan
from areal.runtime.staleness.gate import StalenessGate
from areal.runtime.wire.codec import FrameTooLarge, Unpackable, encode

log = logging.getLogger("areal.controller")


class Admission:
    def __init__(self, node: Node, tasks: Any, plan: Plan, batch_size: int, staleness: int, group_size: int,
                 start_group: int = 0, freed: int = 0, done: frozenset[int] = frozenset(), slack: int = 0) -> None:
        """`start_group`, `freed`, `done`: where a resumed run stands (the trainers' next group; groups freed before
        it; groups above it every trainer consumed already, out of admission order, which never start again).
        `slack`: groups the gate admits beyond its bound (drop_slack)."""
        self.node = node
        self.tasks = tasks
        self.plan = plan
        self.group_size = group_size
        self.gate = StalenessGate(batch_size, staleness, started=start_group, freed=freed, slack=slack)
        self.done = done
        self.issued: dict[int, tuple[Batch, GroupMeta]] = {}  # started, not consumed by every trainer
        self.snapshots: dict[int, dict[str, Any]] = {}  # group -> the source's cursor before it started
        self.problems: list[str] = []  # skipped records, each named (the source's own and the oversized)
        self.oversized = 0
        self._iterator: Iterator[dict[str, Any]] | None = None
        self._source_seen = 0  # of the source's own problems, those already in `problems`
        self._reported = 0  # of `problems`, those new_problems() returned

    def admit(self, version: int, sampled_version: int) -> list[tuple[Batch, GroupMeta]]:
        """Start every group the gate allows at the slowest trainer's `version`; generators must hold
        `sampled_version` of the policy before they sample them."""
        started = []
        while self.gate.allows(version):
            group = self.gate.started
            snapshot = self.cursor()
            task = self._next_task()
            meta = GroupMeta(group=group, samples=self.group_size, admitted_at=sampled_version,
                             slot=self.gate.started - self.gate.freed)
            batch = self.task_batch([task], [group])
            try:
                encode(batch, meta.to_wire(), max_frame_bytes=self.plan.max_frame_bytes,
                       max_header_bytes=self.plan.max_header_bytes)
            except (FrameTooLarge, Unpackable) as err:  # a record that can never be sent: skipped as malformed
                self._skip(task, str(err))
                continue
            if group in self.done:  # its number and its task pass, as they did before the resume; no slot is held
                self.gate.started += 1
                self.gate.freed += 1
                continue
            self.gate.try_start(version)
            self.snapshots[group] = snapshot
            self.issued[group] = (batch, meta)
            started.append((batch, meta))
        return started

    def consumed(self, below: int) -> None:
        """Every trainer has taken the groups below `below`: nothing of them will be sent again."""
        for group in [g for g in self.issued if g < below]:
            del self.issued[group]
        for group in [g for g in self.snapshots if g < below]:
            del self.snapshots[group]

    def free(self, groups: list[int]) -> None:
        """Groups that will never be trained (filtered whole, every sample failed): their slots start others."""
        for group in groups:
            if group in self.issued:
                self.gate.free()

    def reissue(self, skip: set[int], only: set[int]) -> list[tuple[Batch, GroupMeta]]:
        """What to send again: the groups of `only` not consumed below the frontier, and not in `skip` (held by a
        trainer, or decided above the frontier)."""
        return [item for group, item in sorted(self.issued.items()) if group not in skip and group in only]

    def cursor(self) -> dict[str, Any]:
        return self.tasks.state() if isinstance(self.tasks, ResumableSource) else {}

    def cursor_at(self, group: int) -> dict[str, Any]:
        """The source's cursor just before `group` started (now, if it has not)."""
        return self.snapshots.get(group, self.cursor())

    def new_problems(self) -> list[str]:
        """Skipped records reported since last asked (the source's malformed ones and the oversized)."""
        source_problems = list(getattr(self.tasks, "problems", []))
        self.problems += source_problems[self._source_seen:]
        self._source_seen = len(source_problems)
        fresh = self.problems[self._reported:]
        self._reported = len(self.problems)
        return fresh

    @property
    def skipped(self) -> int:
        return int(getattr(self.tasks, "skipped", 0)) + self.oversized

    def task_batch(self, tasks: list[dict[str, Any]], groups: list[int]) -> Batch:
        """Tasks as a group-level batch: the source's fields, named by the source, and the ids."""
        fields: dict[str, Any] = {}
        for port in self.node.outputs:
            if port in ("sample_id", "group_id"):
                continue
            try:
                fields[f"{self.node.name}.{port}"] = [task[port] for task in tasks]
            except KeyError:
                raise RunError(f"{self.node.describe()}: a task has no field '{port}' "
                               f"(it has: {', '.join(tasks[0])})") from None
        ids = torch.tensor(groups, dtype=torch.int64)
        return Batch({**fields, "group_id": ids, "sample_id": ids.clone()})

    def _next_task(self) -> dict[str, Any]:
        with source_errors(self.node.describe()):
            if self._iterator is None:
                self._iterator = iter(self.tasks)
            task = next(self._iterator, None)
            if task is None:  # a finite source replays: a new epoch
                self._iterator = iter(self.tasks)
                task = next(self._iterator, None)
        if task is None:
            raise RunError(f"{self.node.describe()}: the task source is empty")
        return task

    def _skip(self, task: dict[str, Any], why: str) -> None:
        name = f"task {task['task_id']!r}" if "task_id" in task else "a task"
        problem = f"{self.node.describe()}: skipped {name}: {why}"
        log.warning("%s", problem)
        self.oversized += 1
        self.problems.append(problem)


def configured(source: Any, config: RunConfig) -> Any:
    """Sources that depend on the config (`code_tasks`) resolve here; others are used as they are."""
    return source.configure(config) if isinstance(source, ConfiguredSource) else source


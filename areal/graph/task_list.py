"""A recipe's own list of task dicts as a source: `g.source("tasks", [{"prompt": ..., "answer": ...}, ...])`.

Its fields are the first task's keys (every task must have them), so the graph knows its ports when it is
declared. Tasks come in the list's order, epoch after epoch, and its cursor goes into each checkpoint, so a
resumed run goes on with the very next task, as it would with a built-in set.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from areal.errors import ConfigError, GraphError


class TaskList:
    def __init__(self, tasks: Sequence[Mapping[str, Any]], name: str, where: object) -> None:
        """`name`, `where`: the source's name and recipe line, for the error a malformed list gets."""
        prefix = f"{where}: source '{name}'" if where else f"source '{name}'"
        if not tasks:
            raise GraphError([f"{prefix}: the task list is empty"])
        for i, task in enumerate(tasks):
            if not isinstance(task, Mapping):
                raise GraphError([f"{prefix}: task {i} is a {type(task).__name__}, not a dict of fields"])
        self.fields = tuple(tasks[0])
        for i, task in enumerate(tasks):
            if missing := [f for f in self.fields if f not in task]:
                raise GraphError([f"{prefix}: task {i} has no {', '.join(map(repr, missing))} (task 0 has: "
                                  f"{', '.join(self.fields)})"])
        self.tasks = [dict(task) for task in tasks]
        self._epoch, self._index = 0, 0

    def __len__(self) -> int:
        return len(self.tasks)

    @property
    def epoch(self) -> int:
        """Passes begun, minus one: a held-out list is read for one pass (records/evaluation.first_pass)."""
        return self._epoch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        if self._index == len(self.tasks):
            self._epoch, self._index = self._epoch + 1, 0
        self._index += 1
        return copy.deepcopy(self.tasks[self._index - 1])

    def _fingerprint(self) -> str:
        text = json.dumps(self.tasks, sort_keys=True, default=repr)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def state(self) -> dict[str, Any]:
        return {"fingerprint": self._fingerprint(), "epoch": self._epoch, "index": self._index}

    def restore(self, state: dict[str, Any]) -> None:
        if state.get("fingerprint") != self._fingerprint():
            raise ConfigError("the recipe's task list is not the one the run was saved with (its tasks changed); "
                              "resume with the same list")
        self._epoch, self._index = int(state["epoch"]), int(state["index"])

"""What the built-in task sets share: a split fixed by each task's id, and a replayable cycle.

A built-in set is a tuple of task dicts generated in this process. `split_of` puts a task in
"train" or "test" from a hash of its id alone, so no seed can move a task across splits.
`BuiltinTaskSource` cycles through one split for ever, each epoch in an order drawn from
(seed, epoch), and its cursor is a few integers a checkpoint keeps. Its `stop` strings end its tasks' completions
in a run that sets no `generation.stop` (graph/settings.py). Generating the tasks is
each set's own job (`code_tasks.py`, `math_tasks.py`).
"""

from __future__ import annotations

import copy
import hashlib
import random
from collections.abc import Iterator
from typing import Any

from areal.errors import ConfigError

Task = dict[str, Any]

SPLITS = ("train", "test")
TEST_PERCENT = 20


def digest(text: str) -> int:
    """A stable 64-bit hash (Python's `hash` of a str changes per process)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def split_of(task_id: str) -> str:
    """The split a task belongs to, from its id alone (so no seed can move it)."""
    return "test" if digest(task_id) % 100 < TEST_PERCENT else "train"


def select(tasks: tuple[Task, ...], split: str, seed: int, n: int | None, who: str) -> tuple[Task, ...]:
    """The tasks of `split`; `n` keeps a subset of n chosen by `seed`. `who` names the caller in errors."""
    if split not in SPLITS:
        raise ConfigError(f"{who}: unknown split {split!r}; use one of {', '.join(SPLITS)}.")
    pool = [t for t in tasks if split_of(t["task_id"]) == split]
    if n is not None:
        if not 0 < n <= len(pool):
            raise ConfigError(f"{who}: n={n} is out of range; split {split!r} has 1..{len(pool)}.")
        keep = sorted(random.Random(digest(f"subset:{seed}")).sample(range(len(pool)), n))
        pool = [pool[i] for i in keep]
    return tuple(pool)


class BuiltinTaskSource:
    """A replayable stream of tasks: epochs of the split, each in an order drawn from (seed, epoch).

    Iteration never ends (epoch after epoch); `len` is the number of tasks in one epoch. The
    cursor (`state`/`restore`) is what a checkpoint keeps to resume on the very next task.
    """

    def __init__(self, tasks: tuple[Task, ...], split: str, seed: int, stop: tuple[str, ...] = ()) -> None:
        self.tasks = tasks
        self.split = split
        self.seed = seed
        self.stop = stop  # where its tasks' completions end (a run's generation.stop unless it sets one)
        self._epoch = 0
        self._index = 0
        self._order = self._shuffled(0)

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(len(self.tasks)))
        random.Random(digest(f"order:{self.seed}:{epoch}")).shuffle(order)
        return order

    def __len__(self) -> int:
        return len(self.tasks)

    @property
    def epoch(self) -> int:
        """Passes over the tasks begun so far, minus one: it grows with the first task of each new pass."""
        return self._epoch

    def __iter__(self) -> Iterator[Task]:
        return self

    def __next__(self) -> Task:
        if self._index == len(self._order):
            self._epoch, self._index = self._epoch + 1, 0
            self._order = self._shuffled(self._epoch)
        task = self.tasks[self._order[self._index]]
        self._index += 1
        return copy.deepcopy(task)

    def _fingerprint(self) -> str:
        return hashlib.sha256("\n".join(t["task_id"] for t in self.tasks).encode()).hexdigest()[:16]

    def state(self) -> dict[str, Any]:
        """The cursor as plain JSON-able values."""
        return {
            "split": self.split,
            "seed": self.seed,
            "fingerprint": self._fingerprint(),
            "epoch": self._epoch,
            "index": self._index,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a cursor that `state()` of an identical source returned."""
        mine = (self.split, self.seed, self._fingerprint())
        theirs = (state.get("split"), state.get("seed"), state.get("fingerprint"))
        if mine != theirs:
            raise ConfigError(
                f"task cursor (split, seed, fingerprint) = {theirs} was saved from a different task "
                f"source than this one {mine}; resume with the same split, seed and n as the saved run."
            )
        self._epoch, self._index = int(state["epoch"]), int(state["index"])
        self._order = self._shuffled(self._epoch)

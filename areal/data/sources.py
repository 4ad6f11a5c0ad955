"""Task sources chosen by the run's config, so one recipe trains on built-in or user data.

`code_tasks("train")` stands in a recipe for "the training tasks": the runtime calls
`configure(config)` before reading it, which returns a JSONL source when `data.path` (or
`data.heldout_path` for the held-out split) is set, and the built-in tasks otherwise.
"""

from __future__ import annotations

from typing import Any

from areal.config import RunConfig
from areal.data.code_tasks import builtin_code_tasks
from areal.data.jsonl import jsonl_tasks


class ConfiguredTasks:
    """A placeholder the runtime resolves with `configure(config)`; see the module docstring."""

    fields = ("task_id", "prompt", "tests")

    def __init__(self, split: str) -> None:
        self.split = split

    def __repr__(self) -> str:
        return f"code_tasks({self.split!r})"

    def configure(self, config: RunConfig) -> Any:
        path = config.data.path if self.split == "train" else config.data.heldout_path
        if path:
            return jsonl_tasks(path, schema="code", seed=config.data.seed)
        return builtin_code_tasks(split=self.split, seed=config.data.seed)


def code_tasks(split: str = "train") -> ConfiguredTasks:
    """Code tasks of `split` ("train" or "test"): `data.path`/`data.heldout_path` files, else built-in."""
    return ConfiguredTasks(split)

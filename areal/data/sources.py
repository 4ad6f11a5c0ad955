"""Task sources chosen by the run's config, so one recipe trains on built-in or user data.

`code_tasks("train")` (or `math_tasks("train")`) stands in a recipe for "the training tasks":
the runtime calls `configure(config)` before reading it, which returns a JSONL source of that
schema when `data.path` (or `data.heldout_path` for the held-out split) is set (a Parquet source for a
`.parquet` file), and the built-in
tasks otherwise. `builtin:NAME` in either key names another built-in set of the same schema (`builtin:chains`:
code answers with a heavy tail of lengths); the held-out split follows `data.path`'s set unless
`data.heldout_path` names one. Training on a file of one's own with no `data.heldout_path` has no held-out
rounds (said at the start): a built-in set's pass@1 would say nothing of that data, under a name that suggests
it does. A bad file or name is reported with the config key that named it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from areal.config import RunConfig
from areal.data.chain_tasks import builtin_chain_tasks
from areal.data.code_tasks import builtin_code_tasks
from areal.data.jsonl import jsonl_tasks
from areal.data.math_tasks import builtin_math_tasks
from areal.data.parquet import parquet_tasks
from areal.data.schemas import FIELDS
from areal.errors import ConfigError

BUILTIN_PREFIX = "builtin:"
# the named built-in sets of each schema: `builtin:NAME` in data.path or data.heldout_path
BUILTIN_SETS: dict[str, dict[str, Callable[..., Any]]] = {
    "code": {"code": builtin_code_tasks, "chains": builtin_chain_tasks},
    "math": {"math": builtin_math_tasks},
}


class ConfiguredTasks:
    """A placeholder the runtime resolves with `configure(config)`; see the module docstring."""

    def __init__(self, schema: Literal["code", "math"], split: str) -> None:
        self.schema = schema
        self.split = split
        self.fields: tuple[str, ...] = FIELDS[schema]

    def __repr__(self) -> str:
        return f"{self.schema}_tasks({self.split!r})"

    def __iter__(self) -> Any:
        """Refused: which tasks this stands for is the run's config's to say, and the run reads them."""
        raise TypeError(f"{self!r} stands for the tasks a run's config names (data.path, else the built-in set), read "
                        f"as the run starts; to read them here: {self!r}.configure(RunConfig()) (or with the run's "
                        f"RunConfig), or builtin_{self.schema}_tasks({self.split!r}) for the built-in set")

    def named(self, config: RunConfig) -> tuple[str, str | None]:
        """The data key that names this split's tasks under `config`, and what it names (a file or builtin:NAME);
        None for the held-out split of a run that trains on a file and names no held-out one."""
        key = "path" if self.split == "train" else "heldout_path"
        path = getattr(config.data, key)
        if not path and self.split != "train" and config.data.path:
            if not config.data.path.startswith(BUILTIN_PREFIX):
                return key, None
            key, path = "path", config.data.path  # held-out tasks of the training set's built-in set
        return key, path or BUILTIN_PREFIX + self.schema  # else the schema's own built-in set

    def stop_strings(self, config: RunConfig) -> tuple[str, ...]:
        """The stop strings of the tasks `config` names: a built-in set's own; none for a file of one's own (its
        completions are whole programs or answers, which a code body's stops would cut)."""
        key, path = self.named(config)
        if path is None or not path.startswith(BUILTIN_PREFIX):
            return ()
        return tuple(self._named_builtin(key, path.removeprefix(BUILTIN_PREFIX), config.data.seed).stop)

    def configure(self, config: RunConfig) -> Any:
        """The tasks, or None where `named` names none."""
        key, path = self.named(config)
        if path is None:
            return None
        if path.startswith(BUILTIN_PREFIX):
            return self._named_builtin(key, path.removeprefix(BUILTIN_PREFIX), config.data.seed)
        read = parquet_tasks if Path(path).suffix.lower() == ".parquet" else jsonl_tasks
        try:
            return read(path, schema=self.schema, seed=config.data.seed)
        except ConfigError as err:
            raise ConfigError(f"data.{key}: {err}") from None  # every task-file error names the file

    def _named_builtin(self, key: str, name: str, seed: int) -> Any:
        sets = BUILTIN_SETS[self.schema]
        if name not in sets:
            known = ", ".join(BUILTIN_PREFIX + n for n in sets)
            raise ConfigError(f"data.{key}: no built-in {self.schema} tasks named {name!r}; known: {known}.")
        return sets[name](split=self.split, seed=seed)


def code_tasks(split: str = "train") -> ConfiguredTasks:
    """Code tasks of `split` ("train" or "test"): `data.path`/`data.heldout_path` files, else built-in."""
    return ConfiguredTasks("code", split)


def math_tasks(split: str = "train") -> ConfiguredTasks:
    """Math tasks of `split` ("train" or "test"): `data.path`/`data.heldout_path` files, else built-in arithmetic."""
    return ConfiguredTasks("math", split)


def heldout_note(heldout: Any, config: RunConfig) -> str | None:
    """What a run is told at its start when its held-out pass@1 would not measure held-out tasks: none named beside
    a file of one's own, or the training file itself (None for any other run)."""
    if not isinstance(heldout, ConfiguredTasks):
        return None
    named = heldout.named(config)[1]
    if named is None:
        return (f"no held-out rounds: data.path is a file of your own ({config.data.path}) and data.heldout_path is "
                "unset; set data.heldout_path=FILE (tasks kept out of training) for held-out pass@1, or "
                f"data.heldout_path=builtin:{heldout.schema} to score the built-in set")
    train = config.data.path
    if train and not train.startswith(BUILTIN_PREFIX) and Path(named).resolve() == Path(train).resolve():
        return (f"data.heldout_path is data.path ({train}): held-out pass@1 scores tasks the run trains on, so it "
                "measures fitting them, not solving new ones; name a file of tasks kept out of training")
    return None

"""`areal run --resume RUN_DIR`: what a run directory says to continue from, and what it refuses.

A run continues with the recipe and overrides its plan.json recorded, from its newest intact
checkpoint (checkpoint.py names each one it skips and why). It refuses, in one line each, what
would make it a different run with the same sample ids: another recipe, or a change to a
setting that shapes ids or batches (groups per step, samples per group, the model, the seed,
the data). Settings that do not (steps, learning rate, η) may change on resume: that is how a
run is extended or tuned.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal.config import RunConfig
from areal.errors import ConfigError, RecipeError
from areal.runtime.checkpoint import clear_staging, find_checkpoints, read_state

# sample ids are group·G + k with groups numbered i·B on resume, and the source replays by seed:
# a change to any of these would reuse ids for other samples or change what a step holds
ID_SHAPING = ("batch_size", "group_size", "seed", "model", "dtype", "data.path", "data.seed", "data.heldout_path")


@dataclass(frozen=True)
class ResumePoint:
    run_dir: Path
    recipe: str  # as plan.json recorded it
    overrides: list[str]
    checkpoint: Path | None  # the newest intact checkpoint; None: the run restarts from version 0
    saved: dict[str, Any] | None  # that checkpoint's controller state
    skipped: list[str]  # checkpoints passed over, each with the file and the reason


def resume_point(run_dir: Path, named_recipe: Path | str | None = None) -> ResumePoint:
    """Read RUN_DIR/plan.json and find its newest intact checkpoint; clear staging folders a kill left."""
    plan_path = run_dir / "plan.json"
    if not plan_path.is_file():
        raise RecipeError(f"--resume {run_dir}: no plan.json there; is it a run directory?")
    try:
        plan = json.loads(plan_path.read_text())
        recipe, overrides = str(plan["recipe"]), [str(o) for o in plan["overrides"]]
    except (ValueError, KeyError, TypeError) as err:
        raise RecipeError(f"--resume {run_dir}: {plan_path} is damaged ({type(err).__name__}: {err}); "
                          "it records the recipe and overrides the run was started with") from None
    if named_recipe is not None and not _same_file(named_recipe, recipe):
        raise RecipeError(f"--resume {run_dir}: that run was made by {recipe}, not {named_recipe}; "
                          f"resume it with its own recipe, or start a new run")
    clear_staging(run_dir)
    found = find_checkpoints(run_dir)
    newest = found.newest
    return ResumePoint(run_dir, recipe, overrides, newest, read_state(newest) if newest else None, found.skipped)


def refuse_changes(run_dir: Path, config: RunConfig) -> None:
    """Refuse, naming them, changes to settings that shape sample ids or batches since the run was made."""
    recorded_path = run_dir / "config.json"
    try:
        recorded = json.loads(recorded_path.read_text())
    except FileNotFoundError:
        return  # the run never got as far as starting: nothing was made with other settings
    except ValueError as err:
        raise RecipeError(f"--resume {run_dir}: {recorded_path} is damaged ({err})") from None
    now = config.model_dump()
    changed = [f"{key} {_at(recorded, key)!r} -> {_at(now, key)!r}" for key in ID_SHAPING
               if _at(recorded, key) != _at(now, key)]
    if changed:
        raise ConfigError(f"--resume {run_dir}: {'; '.join(changed)}: these shape sample ids and batches, so the "
                          "resumed run would reuse ids for other samples; keep them, or start a new run")


def _at(data: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        data = data.get(part) if isinstance(data, dict) else None  # type: ignore[assignment]
    return data


def _same_file(a: Path | str, b: Path | str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()

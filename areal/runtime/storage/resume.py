"""`areal run --resume RUN_DIR`: what a run directory says to continue from, and what it refuses.

A run continues with the recipe and overrides its plan.json recorded, from its newest intact
checkpoint (checkpoint.py names each one it skips and why). It refuses, in one line each, what
would make it a different run with the same sample ids: another recipe, or a change to a
setting that shapes ids or batches (groups per step, samples per group, the model, the seed,
the data). Settings that do not (steps, learning rate, η) may change on resume: that is how a
run is extended or tuned, and every one that changed is reported. The recipe file itself is
recorded by its sha256 (plan.json) and a copy (recipe.py): an edited recipe is refused unless
the user says so (`--allow-recipe-change`), and then the edit is shown. A run whose every
checkpoint is unreadable is refused, naming each file, unless the user asks to start it over
from version 0 in the same directory (`--start-over`).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal.config import RunConfig
from areal.errors import ConfigError, RecipeError
from areal.runtime.storage.checkpoint import clear_staging, find_checkpoints, read_state

# sample ids are group·G + k with groups numbered i·B on resume, and the source replays by seed:
# a change to any of these would reuse ids for other samples or change what a step holds
RECIPE_COPY = "recipe.py"  # the recipe's text as the run was started (or last resumed) with it
MAX_DIFF_LINES = 20
ID_SHAPING = ("batch_size", "group_size", "seed", "model", "dtype", "data.path", "data.seed", "data.heldout_path")


@dataclass(frozen=True)
class ResumePoint:
    run_dir: Path
    recipe: str  # as plan.json recorded it
    overrides: list[str]
    checkpoint: Path | None  # the newest intact checkpoint; None: the run restarts from version 0
    saved: dict[str, Any] | None  # that checkpoint's controller state
    skipped: list[str]  # checkpoints passed over, each with the file and the reason
    recipe_edit: list[str]  # the recipe's changes since the run recorded it (allowed), as diff lines; [] if none


def resume_point(run_dir: Path, named_recipe: Path | str | None = None, *, allow_recipe_change: bool = False,
                 start_over: bool = False) -> ResumePoint:
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
        if Path(recipe).exists():
            raise RecipeError(f"--resume {run_dir}: that run was made by {recipe}, not {named_recipe}; "
                              f"resume it with its own recipe, or start a new run")
        recipe = str(Path(named_recipe).resolve())  # the run's recipe, moved: it goes on from where it is now
    edit = _recipe_edit(run_dir, recipe, str(plan.get("recipe_sha256", "")), allow_recipe_change)
    clear_staging(run_dir)
    found = find_checkpoints(run_dir)
    newest = found.newest
    if newest is None and found.skipped and not start_over:
        listed = "".join(f"\n  {line}" for line in found.skipped)
        raise RecipeError(f"--resume {run_dir}: no checkpoint can be read:{listed}\n  resuming would start the run "
                          "over from version 0 in this directory, replacing its weights and metrics: pass "
                          "--start-over for that, or restore a checkpoint")
    return ResumePoint(run_dir, recipe, overrides, newest, read_state(newest) if newest else None, found.skipped,
                       edit)


def recipe_hash(path: Path | str) -> str:
    """The sha256 of a recipe file's bytes, as plan.json records it."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _recipe_edit(run_dir: Path, recipe: str, recorded: str, allowed: bool) -> list[str]:
    """The recipe's edit since the run recorded it (diff lines of its saved copy), [] when unchanged; an edit is
    refused unless `allowed`."""
    try:
        now = recipe_hash(recipe)
    except OSError as err:
        raise RecipeError(f"--resume {run_dir}: cannot read the run's recipe {recipe} ({err.strerror}); moved? name it "
                          f"where it is now: areal run NEW/PATH.py --resume {run_dir} (its text is checked against "
                          f"{run_dir / RECIPE_COPY})") from None
    if not recorded or recorded == now:
        return []
    saved = run_dir / RECIPE_COPY
    before = saved.read_text(errors="replace").splitlines() if saved.is_file() else []
    diff = [line for line in difflib.unified_diff(before, Path(recipe).read_text(errors="replace").splitlines(),
                                                 f"{RECIPE_COPY} (as the run recorded it)", recipe, n=0, lineterm="")
            if not line.startswith("@@")][:MAX_DIFF_LINES] or [f"sha256 {recorded[:12]} -> {now[:12]}"]
    if not allowed:
        shown = "".join(f"\n    {line}" for line in diff)
        raise RecipeError(f"--resume {run_dir}: the recipe {recipe} was edited since the run was made:{shown}\n  its "
                          "checkpoints were trained under the recorded one; pass --allow-recipe-change to go on "
                          "under the edited recipe, or start a new run")
    return diff


def check_changes(run_dir: Path, config: RunConfig) -> list[str]:
    """Every setting changed since the run was made, as "key old -> new"; refuse, naming them, changes to settings
    that shape sample ids or batches."""
    recorded_path = run_dir / "config.json"
    try:
        recorded = json.loads(recorded_path.read_text())
    except FileNotFoundError:
        return []  # the run never got as far as starting: nothing was made with other settings
    except ValueError as err:
        raise RecipeError(f"--resume {run_dir}: {recorded_path} is damaged ({err})") from None
    now = json.loads(config.model_dump_json())
    changed = [f"{key} {_at(recorded, key)!r} -> {_at(now, key)!r}" for key in ID_SHAPING
               if _at(recorded, key) != _at(now, key)]
    if changed:
        raise ConfigError(f"--resume {run_dir}: {'; '.join(changed)}: these shape sample ids and batches, so the "
                          "resumed run would reuse ids for other samples; keep them, or start a new run")
    before, after = _flat(recorded), _flat(now)
    return [f"{key} {_shown(before, key)} -> {_shown(after, key)}"
            for key in sorted(before.keys() | after.keys()) if before.get(key) != after.get(key)]


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys -> leaf values (lists are leaves; an empty map has none)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat |= _flat(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _shown(flat: dict[str, Any], key: str) -> str:
    return repr(flat[key]) if key in flat else "(unset)"


def _at(data: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        data = data.get(part) if isinstance(data, dict) else None  # type: ignore[assignment]
    return data


def _same_file(a: Path | str, b: Path | str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()

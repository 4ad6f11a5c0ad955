"""Checkpoints that are whole or absent: staged, sealed by a manifest, renamed into place, verified on read.

A checkpoint is written into a staging folder (`checkpoints/.step-N.<tag>.partial`): the trainer
writes its files there, then the controller adds the policy and `controller.json`, whose
"files" manifest records every file's size, and renames the folder to `step-N`. A rename is
atomic, so a run killed at any moment leaves either a complete checkpoint or a staging folder
that nothing reads. A finished checkpoint is never written again: asked for the same version
twice (the exit checkpoint right after an interval one), the second is discarded. Readers
(`--resume`, `areal export`) take the newest checkpoint whose manifest matches the disk and
name every one they skip and why.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal.runtime.storage import weight_files
from areal.runtime.storage.rundir import writing

MANIFEST = "controller.json"


def policy_name(model: str) -> str:
    """A model's weights in a checkpoint (what `areal export` writes out and a resumed generator loads)."""
    return f"policy-{model}.safetensors"


def checkpoints_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / "checkpoints"


def final_dir(run_dir: Path | str, version: int) -> Path:
    return checkpoints_dir(run_dir) / f"step-{version:06d}"


def staging_dir(run_dir: Path | str, version: int, tag: str | None = None) -> Path:
    """The folder to write version `version`'s checkpoint into. Every trainer writes its part of an interval
    checkpoint into the same one (`tag="interval"`); any other request gets a fresh one, so a request for a
    version that is being checkpointed already never writes into its folder."""
    return checkpoints_dir(run_dir) / f".step-{version:06d}.{tag or uuid.uuid4().hex[:8]}.partial"


def seal(staged: Path, version: int, state: dict[str, Any], policies: dict[str, Path]) -> Path | None:
    """Add each model's published weights and the manifest to a staged checkpoint, then rename it into place.

    `policies`: model -> its published weights file of this version (copied as `policy-MODEL.safetensors`,
    what generators load after a resume). Returns the final folder, or None when version `version` is
    already checkpointed (the staged copy is removed: a finished checkpoint is never rewritten in place).
    """
    final = final_dir(staged.parent.parent, version)
    if final.exists():
        shutil.rmtree(staged, ignore_errors=True)
        return None
    staged.mkdir(parents=True, exist_ok=True)
    for model, published in policies.items():
        if published.exists():
            shutil.copyfile(published, staged / policy_name(model))
    files = {str(p.relative_to(staged)): p.stat().st_size for p in sorted(staged.rglob("*")) if p.is_file()}
    for name in files:
        _fsync(staged / name)
    manifest = staged / MANIFEST
    with manifest.open("w") as out:
        json.dump({**state, "version": version, "files": files}, out)
        out.write("\n")
        out.flush()
        os.fsync(out.fileno())
    os.rename(staged, final)  # the checkpoint exists from this instant, whole
    _fsync(final.parent)
    return final


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Found:
    """The intact checkpoints of a run (step -> folder) and, for each one passed over, why."""

    intact: dict[int, Path]
    skipped: list[str]

    @property
    def newest(self) -> Path | None:
        return self.intact[max(self.intact)] if self.intact else None


def find_checkpoints(run_dir: Path | str) -> Found:
    intact: dict[int, Path] = {}
    skipped: list[str] = []
    for folder in sorted(checkpoints_dir(run_dir).glob("step-*")):
        problem = broken(folder)
        if problem is None:
            intact[int(folder.name.split("-")[1])] = folder
        else:
            skipped.append(f"{folder}: {problem}")
    return Found(intact, skipped)


def broken(folder: Path) -> str | None:
    """Why `folder` is not a whole checkpoint (naming the file), or None when every file matches its manifest."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return f"no {MANIFEST} (written last: the checkpoint never finished)"
    except (OSError, ValueError) as err:
        return f"{MANIFEST} is unreadable ({err})"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not isinstance(manifest.get("version"), int):
        return f"{MANIFEST} has no 'version' and 'files' manifest"
    for name, size in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} is {path.stat().st_size} B, the manifest says {size} B (a write was cut short)"
    return None


def read_state(folder: Path) -> dict[str, Any]:
    """The controller's state a checkpoint holds (verified with `broken` first)."""
    state: dict[str, Any] = json.loads((folder / MANIFEST).read_text())
    return state


def prune(run_dir: Path | str, keep: int) -> None:
    """Keep the newest `keep` intact checkpoints (made by this process or an earlier one); remove the rest."""
    found = find_checkpoints(run_dir)
    for step in sorted(found.intact)[:-keep]:
        shutil.rmtree(found.intact[step], ignore_errors=True)


def clear_staging(run_dir: Path | str) -> None:
    """Remove staging folders a killed run left behind (nothing reads them)."""
    for staged in checkpoints_dir(run_dir).glob(".step-*.partial"):
        shutil.rmtree(staged, ignore_errors=True)


class Sealing:
    """Staging folders that wait for every trainer's part; the last part in seals the checkpoint, with the
    controller's own state (`state_at(first group not yet trained by every trainer)`) beside them."""

    def __init__(self, run_dir: Path, weights_dir: Path, trainers: list[str], keep: int) -> None:
        self.run_dir, self.weights_dir, self.trainers, self.keep = run_dir, weights_dir, trainers, keep
        # staging folder -> trainer -> its next group, and the groups above it it consumed
        self._parts: dict[str, dict[str, tuple[int, list[int]]]] = {}
        self.sealed: set[str] = set()  # staging folders every trainer wrote its part into, sealed (or not needed)

    def part_written(self, folder: str, trainer: str, version: int, next_group: int, consumed: list[int],
                     state_at: Callable[[int], dict[str, Any]]) -> None:
        parts = self._parts.setdefault(folder, {})
        parts[trainer] = (next_group, consumed)
        if set(parts) != set(self.trainers):
            return
        del self._parts[folder]
        state = {**state_at(min(n for n, _ in parts.values())), "next_group": {t: n for t, (n, _) in parts.items()},
                 "consumed": {t: c for t, (_, c) in parts.items()}}
        policies = {t: weight_files.published(self.weights_dir, t, version) for t in self.trainers}
        with writing(Path(folder), self.run_dir):  # a full disk: the staging folder is left, resume clears it
            sealed = seal(Path(folder), version, state, policies)
        self.sealed.add(folder)
        if sealed is not None:
            prune(self.run_dir, self.keep)

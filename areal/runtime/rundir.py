"""A run directory belongs to one run: locked while a run uses it, and refused to a new run once used.

`claim_run_dir` takes an exclusive flock on `RUN_DIR/run.lock` (released by the kernel when the
process ends, however it ends) and writes the holder's pid into it, so a second `areal run` on a
directory in use fails at once, naming the pid, instead of deleting the first run's sockets or
mixing its metrics and checkpoints into the other's. A directory where a run was started (it has
a plan.json) is refused to a fresh run: only `--resume` continues it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from areal.errors import ConfigError, RecipeError, RunError

LOCK_FILE = "run.lock"


class RunDirLock:
    """Held while its file is open: `release` (or the process's end) lets another run take the directory."""

    def __init__(self, folder: Path, file: IO[str]) -> None:
        self.folder = folder
        self._file = file

    def release(self) -> None:
        self._file.close()


def claim_run_dir(folder: Path, resuming: bool) -> RunDirLock:
    """Lock `folder` for this process's run; refuse it when another run holds it, or when a run was started there
    and this one does not resume it."""
    if resuming and not folder.is_dir():
        raise RecipeError(f"--resume {folder}: no such directory")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        file = (folder / LOCK_FILE).open("a+")
    except OSError as err:
        raise RunError(f"cannot use run directory {folder}: {err.strerror} ({err.filename or folder})") from None
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.seek(0)
        holder = file.read().strip() or "unknown"
        file.close()
        raise RunError(f"run directory {folder} is in use by another run (pid {holder}, which holds "
                       f"{folder / LOCK_FILE}); wait for it to end, or choose another --run-dir") from None
    if not resuming and (folder / "plan.json").exists():
        file.close()
        raise ConfigError(f"run directory {folder} holds a run already (its plan.json); continue it with "
                          f"`areal run --resume {folder}`, or choose another --run-dir")
    file.seek(0)
    file.truncate()
    file.write(f"{os.getpid()}\n")
    file.flush()
    return RunDirLock(folder, file)


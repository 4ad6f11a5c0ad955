"""A run directory belongs to one run: locked while a run uses it, and refused to a new run once used.

`claim_run_dir` takes an exclusive flock on `RUN_DIR/run.lock` (released by the kernel when the
process ends, however it ends) and writes the holder's pid into it, so a second `areal run` on a
directory in use fails at once, naming the pid, instead of deleting the first run's sockets or
mixing its metrics and checkpoints into the other's. A directory where a run was started (it has
a plan.json) is refused to a fresh run: only `--resume` continues it.

`writing` turns a write into the run directory that fails (a full disk, a folder made read-only)
into a run error that names the file and the way on, instead of a traceback: checkpoints are
sealed by rename, so nothing a resume reads is torn.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
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


def held(folder: Path) -> bool:
    """Whether the process that holds the run directory (its pid in run.lock) still runs; read, never locked."""
    try:
        pid = int((folder / LOCK_FILE).read_text().split()[0])
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, IndexError, ProcessLookupError):
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    return True


class WriteFailed(RunError):
    """A write into the run directory failed; the message names the file and says how to go on."""


@contextmanager
def writing(path: Path, run_dir: Path) -> Iterator[None]:
    """Raise WriteFailed naming the file (the one the OS names, else `path`) when a write in the block fails."""
    try:
        yield
    except OSError as err:
        why = err.strerror or str(err)
        again = (f"continue with `areal run --resume {run_dir}`" if (run_dir / "plan.json").exists()
                 else "start the run again")
        raise WriteFailed(f"cannot write {err.filename or path}: {why}; free space (or restore write access to "
                       f"{run_dir}), then {again}") from None


def write_atomically(path: Path, text: str, run_dir: Path) -> None:
    """`path` holds `text` whole, or keeps what it held: a full disk never leaves it cut short."""
    tmp = path.with_name(f".{path.name}.tmp")
    with writing(path, run_dir):
        tmp.write_text(text)
        os.replace(tmp, path)

"""A worker lifts its soft limit on open files (an episode worker holds a socket per agent's connection)."""

from __future__ import annotations

import resource
import subprocess
import sys

from areal.runtime.worker.main import OPEN_FILES

PROBE = """
import resource
from areal.runtime.worker.main import raise_open_files_limit
said = raise_open_files_limit()
print(said, *resource.getrlimit(resource.RLIMIT_NOFILE))
"""


def _limits_after_raising(soft: int, hard: int) -> list[int]:
    """(what raise_open_files_limit returned, soft, hard) in a child started under (soft, hard)."""
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)))
    assert done.returncode == 0, done.stderr[-2000:]
    return [int(x) for x in done.stdout.split()]


def test_the_soft_limit_rises_to_the_hard_limit_and_never_past_it():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    below = OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES)
    assert _limits_after_raising(256, below) == [below, below, below]  # raised to a hard limit below OPEN_FILES
    if hard == resource.RLIM_INFINITY or hard > OPEN_FILES:
        assert _limits_after_raising(256, hard)[:2] == [OPEN_FILES, OPEN_FILES]  # at most OPEN_FILES
    assert _limits_after_raising(below, below)[:2] == [below, below]  # already there: left as it is

"""Tests of waits on a descriptor past select's limit: a process holding more than 1023 files (an episode worker
with an agent's socket per episode, a controller of many workers), where select.select raises ValueError."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

SELECT_LIMIT = 1024  # FD_SETSIZE
NEEDED = 2 * SELECT_LIMIT  # open files the test process may hold: the ones it takes, and its own


@contextmanager
def low_descriptors_taken() -> Iterator[None]:
    """Open files until the next descriptor this process gets is past select's limit; closed on leaving. A soft
    limit of 1024 (a user's shell, CI) is lifted for the while, as a worker lifts its own; a hard one never is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lift = soft != resource.RLIM_INFINITY and soft < NEEDED and (hard == resource.RLIM_INFINITY or hard >= NEEDED)
    if lift:
        resource.setrlimit(resource.RLIMIT_NOFILE, (NEEDED, hard))
    held: list[int] = []
    try:
        try:
            while not held or held[-1] < SELECT_LIMIT + 8:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as err:  # a hard limit below what the test needs
            pytest.skip(f"this process may not hold {SELECT_LIMIT} files: {err}")
        yield
    finally:
        for fd in held:
            os.close(fd)
        if lift:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

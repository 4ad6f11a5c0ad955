"""Tests of waits on a descriptor past select's limit: a process holding more than 1023 files (an episode worker
with an agent's socket per episode, a controller of many workers), where select.select raises ValueError."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

SELECT_LIMIT = 1024  # FD_SETSIZE


@contextmanager
def low_descriptors_taken() -> Iterator[None]:
    """Open files until the next descriptor this process gets is past select's limit; closed on leaving."""
    held: list[int] = []
    try:
        while not held or held[-1] < SELECT_LIMIT + 8:
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError as err:  # a soft limit of 1024 open files: nothing to test here
        for fd in held:
            os.close(fd)
        pytest.skip(f"this process may not hold {SELECT_LIMIT} files: {err}")
    try:
        yield
    finally:
        for fd in held:
            os.close(fd)

"""Running a function in a few spawned processes (ranks, group members), bounded in time; waiting on pids."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a rendezvous the spawned processes meet at."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_spawned(fn: Callable[..., None], args: tuple[Any, ...], nprocs: int, timeout_s: float, what: str) -> None:
    """fn(index, *args) in `nprocs` spawned processes; raises if any fails or all have not ended in time,
    and kills (by process handle) whatever is still running."""
    context = mp.start_processes(_run_then_exit, args=(fn, *args), nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not finish within {timeout_s} s")
    finally:
        for p in context.processes:
            if p.is_alive():
                p.kill()
                p.join(10)


def _run_then_exit(index: int, fn: Callable[..., None], *args: Any) -> None:
    """fn, then exit at once: a finished rank skips the interpreter's teardown, where gloo's threads can still
    abort it (CI once saw a rank that had passed its final barrier die of SIGABRT, "terminate called without
    an active exception"). An exception still reaches the parent with its traceback."""
    fn(index, *args)
    os._exit(0)


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """Wait on each pid (any process, not only a child: through a pidfd) until it has ended or `timeout_s` has
    passed; the pids still running then. A zombie nobody has reaped counts as ended."""
    deadline = time.monotonic() + timeout_s
    left = []
    for pid in pids:
        try:
            handle = os.pidfd_open(pid)
        except ProcessLookupError:
            continue  # gone already
        try:
            readable, _, _ = select.select([handle], [], [], max(0.0, deadline - time.monotonic()))
        finally:
            os.close(handle)
        if not readable:
            left.append(pid)
    return left


def end_session(proc: subprocess.Popen[str]) -> None:
    """Kill what is left of a process started in a session of its own (its whole group: an `areal run` with its
    fork server), then reap it."""
    with contextlib.suppress(ProcessLookupError):  # a run that already ended may have no group left
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)

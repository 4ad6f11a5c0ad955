"""A worker's process group dies with the worker, however the worker ends; and the worker with its fork server,
the fork server with its controller (`die_with_parent`).

A local worker leads a process group of its own (the fork server starts it in a new session), and
whatever it starts (an agent's tool, a sandbox) joins that group. The controller kills the group
when it replaces or stops a worker; but a worker that dies with its controller (kill -9 of the
whole run: Linux kills the worker, not its children) leaves its children behind. So each worker
starts a guard, a tiny shell in its group that waits on a pipe only the worker holds: when the
worker is gone, by any exit or any signal, the pipe closes and the guard kills the whole group.
A child that made a session of its own (setsid) is out of the group and out of reach: the code
sandbox takes those down with its PID namespace.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess

PR_SET_PDEATHSIG = 1
_held: list[int] = []  # the pipe's write end: never closed while the worker lives


def guard_process_group() -> int | None:
    """Start the guard when this process leads its own group; its pid, or None (a Ray actor, an embedded call)."""
    if os.getpgid(0) != os.getpid():
        return None  # the group is someone else's (Ray's worker process): not ours to kill
    read_end, write_end = os.pipe()  # both ends close-on-exec: no tool the worker starts inherits the write end
    try:
        # `read` returns at end of file; then `kill 0` signals every process in the group, the guard included
        guard = subprocess.Popen(["sh", "-c", "read _; kill -KILL 0"], stdin=read_end, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    finally:
        os.close(read_end)
    _held.append(write_end)
    return guard.pid


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the thread that forked it ends (a worker's fork server, the fork
    server's controller): called in the child, before exec or before any work."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

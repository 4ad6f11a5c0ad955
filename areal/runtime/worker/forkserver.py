"""A run's local workers are forked from one process that has already imported what every worker imports.

A worker started as a fresh interpreter spends seconds of CPU before it does anything: `import torch` alone is
about 2 s on this project's CI machine, and a run starts four or five workers at once, plus one for every
restart, on the cores the run itself needs. This process pays that once per controller process
(launchers.py), however many runs and restarts it starts. It reads requests on stdin,
one JSON line each (`{"id", "module", "args", "log", "env", "cwd"}`), and forks a child that exits with
`module.main(args)` (areal.runtime.worker.main's, for a worker). On the pipe named by its argument it answers
each request with the child's pid (`{"id", "pid"}`), and later with its exit status (`{"exit": pid, "status"}`,
negative for a signal, as `subprocess` gives it). End of file on stdin (the controller is done, or gone) ends it.

The child becomes what a worker started as `python -m` in a new session was: its own session, stdin from
/dev/null, stdout and stderr appended to its log, the controller's environment and working directory, the signal
dispositions and the random state of a new process; Linux kills it when this process dies (and this process
when the controller dies: launchers.py). Nothing here starts a thread, so the fork copies a process in a known
state (torch's own native thread, idle after import, is not copied and is not needed).
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import random
import select
import signal
import sys
from typing import Any

import areal.runtime.worker.main  # noqa: F401  the imports every worker pays, paid once here
from areal.runtime.worker.reaper import die_with_parent


def serve(replies: int) -> dict[str, Any]:
    """Fork a child for each request on stdin and report it; returns only in a child, with its request."""
    wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_write)  # a child's exit wakes the select below
    signal.signal(signal.SIGCHLD, lambda *_: None)
    pending = b""
    while True:
        ready = select.select([0, wake_read], [], [])[0]
        if wake_read in ready:
            while _drained(wake_read):
                pass
        _report_exits(replies)
        if 0 not in ready:
            continue
        data = os.read(0, 1 << 16)
        if not data:
            os._exit(0)  # the controller is done (or gone); nothing here to flush, and the children die with it
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            request = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            # the imports every child shares, frozen: a child's full collections neither scan them nor write to
            # their pages (which copy-on-write then keeps shared); cyclic garbage collected first, or never
            gc.collect()
            gc.freeze()
            pid = os.fork()
            if pid == 0:
                _become_new(request, (replies, wake_read, wake_write))
                return request
            _send(replies, {"id": request["id"], "pid": pid})


def _drained(fd: int) -> bool:
    try:
        return bool(os.read(fd, 4096))
    except BlockingIOError:
        return False


def _report_exits(replies: int) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(replies, {"exit": pid, "status": os.waitstatus_to_exitcode(status)})


def _send(replies: int, message: dict[str, Any]) -> None:
    os.write(replies, (json.dumps(message) + "\n").encode())  # one line is far under PIPE_BUF: written whole


def _become_new(request: dict[str, Any], inherited: tuple[int, ...]) -> None:
    """In the child: leave the fork server's state behind and take on a new process's."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in inherited:
        os.close(fd)
    os.setsid()
    server = os.getppid()
    die_with_parent()
    if os.getppid() != server:
        os._exit(1)  # the fork server died before the child could ask to die with it
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.chdir(request["cwd"])
    sys.path[0] = request["cwd"]  # -m put the server's directory first; a worker's own is its controller's
    os.environ.clear()
    os.environ.update(request["env"])
    random.seed()  # a new interpreter seeds from the OS; a fork would repeat the server's sequence
    sys.argv = [request["module"], *request["args"]]


if __name__ == "__main__":
    child = serve(int(sys.argv[1]))
    sys.exit(importlib.import_module(child["module"]).main(child["args"]))

"""What a launcher is given (a `WorkerSpec`: one pool replica and what it needs) and gives back (a
`WorkerHandle` the controller can poll and kill, wherever the worker runs), and the launcher of local child
processes. Ray's launcher is ray_launcher.py; placement.py picks one.

`LocalLauncher` forks each worker from a fork server (areal/runtime/worker/forkserver.py) that has imported what
workers import, so a process pays torch's import once, not once per worker, restart and run. Each worker runs in its own
session, killed with its whole group, and dies when the controller dies (the fork server does, and takes its
children with it); whatever a worker started dies with it (its guard, reaper.py).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from areal.errors import RunError
from areal.runtime.compiler.plan import Plan
from areal.runtime.worker.reaper import die_with_parent

KILL_WAIT_S = 10.0
START_TIMEOUT_S = 300.0  # the fork server's imports, on a loaded machine


@dataclass(frozen=True)
class WorkerSpec:
    """One replica to start: `args` are `areal.runtime.worker.main`'s command-line arguments."""

    pool: str
    replica: int
    replicas: int  # of the pool: Ray reserves them together
    args: tuple[str, ...]
    log_path: Path
    cpus: int = 1
    gpus: int = 0
    run_dir: str = ""
    endpoints: tuple[str, ...] = ()  # every endpoint of the plan (control and data)
    one_node: bool = False  # the pool's replicas meet on 127.0.0.1 (a trainer's ranks): Ray keeps them together

    @property
    def worker_id(self) -> str:
        return f"{self.pool}[{self.replica}]"


class WorkerHandle(Protocol):
    """A started worker: `poll` gives its exit code once it ended; `kill` ends it and what it started; `waiting`
    says what it waits for while it has not started (Ray: a node with room for it)."""

    pid: int  # the worker process's pid (on its node, for Ray); 0 until it runs
    node: str  # where it runs, as shown: "local", or the Ray node's IP (with its id where nodes share an IP)
    host: str  # the machine, as compared: "local", or the Ray node's id
    ended_by: str | None  # what ended it, where the launcher knows more than its exit code (Ray's stated cause)

    def poll(self) -> int | None: ...
    def kill(self) -> None: ...
    def waiting(self) -> str | None: ...


class Launcher(Protocol):
    def start(self, spec: WorkerSpec) -> WorkerHandle: ...


def worker_spec(plan: Plan, plan_path: Path, pool: str, replica: int, version: int, resume_dir: Path | None,
                log_path: Path) -> WorkerSpec:
    """What the plan asks for one replica: the worker's arguments and its pool's resources."""
    spec = plan.pool(pool)
    args = (str(plan_path), pool, str(replica), str(version))
    return WorkerSpec(
        pool=pool, replica=replica, replicas=spec.replicas,
        args=args + ((str(resume_dir),) if resume_dir else ()), log_path=log_path,
        cpus=spec.threads, gpus=spec.gpus, run_dir=plan.run_dir, one_node=bool(spec.rendezvous),
        endpoints=tuple(plan.bound_endpoints()),
    )


# ---- local processes -------------------------------------------------------------------------------


class ForkServer:
    """The controller's end of a fork server (areal/runtime/worker/forkserver.py): one process that has imported
    what workers import, asked over a pipe to fork each worker, and telling back each one's pid and exit."""

    def __init__(self) -> None:
        replies, reply_end = os.pipe()
        # its own session, out of reach of the terminal's ^C like the workers; dies with the controller. It says
        # nothing unless it fails, and then on the controller's stderr, where the run's own errors go.
        self.process = subprocess.Popen(
            [sys.executable, "-m", "areal.runtime.worker.forkserver", str(reply_end)], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, pass_fds=(reply_end,), start_new_session=True, preexec_fn=die_with_parent,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        os.close(reply_end)
        os.set_blocking(replies, False)
        self._lock = threading.Lock()  # runs in threads of one process share the server
        self._replies = replies
        self._unread = b""
        self._asked = 0
        self._pids: dict[int, int] = {}  # request id -> the child's pid
        self._exits: dict[int, int] = {}  # pid -> exit status, until its handle takes it

    def alive(self) -> bool:
        return self.process.poll() is None

    def start(self, module: str, args: tuple[str, ...], log_path: Path, env: dict[str, str]) -> ForkedHandle:
        """Fork a child that runs `module.main(args)` with its output on `log_path`; waits for its pid (the first
        start waits for the server's imports)."""
        with self._lock:
            self._asked += 1
            asked = self._asked
            request = {"id": asked, "module": module, "args": list(args), "log": str(log_path), "env": env,
                       "cwd": os.getcwd()}
            try:
                assert self.process.stdin is not None
                self.process.stdin.write((json.dumps(request) + "\n").encode())
                self.process.stdin.flush()
            except BrokenPipeError:
                pass  # it died: said below
        deadline = time.monotonic() + START_TIMEOUT_S
        while asked not in self._pids:
            if not self.alive() or time.monotonic() > deadline:
                self.close()
                raise RunError(f"the fork server that starts local workers {self._why_not()} (its output is above, "
                               f"on stderr)")
            self.read_replies(0.2)
        with self._lock:
            return ForkedHandle(self, self._pids.pop(asked))

    def exit_status(self, pid: int) -> int | None:
        """The child's exit status once it ended (SIGKILL's if the server died: its children died with it)."""
        self.read_replies(0.0)
        with self._lock:
            if pid in self._exits:
                return self._exits.pop(pid)
        return None if self.alive() else -signal.SIGKILL

    def close(self) -> None:
        """End of file on its stdin ends it; its children end with it."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self.process.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=KILL_WAIT_S)
        if self._replies >= 0:
            os.close(self._replies)
            self._replies = -1

    def _why_not(self) -> str:
        code = self.process.poll()
        return f"exited with code {code}" if code is not None else f"gave no pid within {START_TIMEOUT_S:.0f} s"

    def read_replies(self, timeout: float) -> None:
        if self._replies < 0:
            return
        replies = select.poll()  # select.select refuses an fd past 1023: a controller of many workers holds more
        replies.register(self._replies, select.POLLIN)
        if not replies.poll(timeout * 1000):
            return
        with self._lock:
            try:
                data = os.read(self._replies, 1 << 16)
            except OSError:
                return  # another thread read it first (the pipe does not block), or the server is closed
            *lines, self._unread = (self._unread + data).split(b"\n")
            for line in lines:
                reply = json.loads(line)
                if "pid" in reply:
                    self._pids[reply["id"]] = reply["pid"]
                    self._exits.pop(reply["pid"], None)  # an earlier child's pid, reused
                else:
                    self._exits[reply["exit"]] = reply["status"]


class ForkedHandle:
    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid
        self.node = self.host = "local"
        self.ended_by: str | None = None  # the exit status says it all
        self._status: int | None = None

    def poll(self) -> int | None:
        if self._status is None:
            self._status = self.server.exit_status(self.pid)
        return self._status

    def waiting(self) -> str | None:
        return None  # a local process starts at once

    def kill(self) -> None:
        """Kill the worker's whole session (it and the processes it started) by its pid; wait for its exit."""
        if self.poll() is not None:
            return
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + KILL_WAIT_S
        while self.poll() is None and time.monotonic() < deadline:
            self.server.read_replies(0.1)


class LocalLauncher:
    """Local workers, forked by this process's fork server (`fork_server`)."""

    def start(self, spec: WorkerSpec) -> ForkedHandle:
        with open(spec.log_path, "ab"):
            pass  # a log the worker could not write fails here, in the controller, naming the file
        # own session: the worker and whatever it starts (sandbox processes) die together
        # and die with the controller: a kill -9 of the run must not leave workers behind
        return fork_server().start("areal.runtime.worker.main", spec.args, spec.log_path,
                                   {**os.environ, "PYTHONUNBUFFERED": "1"})


_SERVERS: dict[str, ForkServer] = {}  # by PYTHONPATH, which decides what a worker can import


def fork_server() -> ForkServer:
    """This process's fork server, started on first use and shared by its runs (a test session, a sweep in a
    notebook pay the imports once); a new one if it died, or if PYTHONPATH changed since it started. A process
    forked from this one starts its own: to it the server is no child, and Popen says a non-child has ended."""
    key = os.environ.get("PYTHONPATH", "")
    server = _SERVERS.get(key)
    if server is None or not server.alive():
        server = _SERVERS[key] = ForkServer()
    return server


@atexit.register
def _close_fork_servers() -> None:
    for server in _SERVERS.values():
        server.close()

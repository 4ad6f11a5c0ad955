"""What a launcher is given (a `WorkerSpec`: one pool replica and what it needs) and gives back (a
`WorkerHandle` the controller can poll and kill, wherever the worker runs), and the launcher of local child
processes. Ray's launcher is ray_launcher.py; placement.py picks one.

`LocalLauncher` starts a child process in its own session, killed with its whole group, and told by Linux to
die when the controller dies; whatever it started dies with it (its guard, reaper.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from areal.runtime.compiler.plan import Plan

KILL_WAIT_S = 10.0


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


class LocalHandle:
    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.pid = process.pid
        self.node = self.host = "local"

    def poll(self) -> int | None:
        return self.process.poll()

    def waiting(self) -> str | None:
        return None  # a local process starts at once

    def kill(self) -> None:
        """Kill the worker's whole session (it and the processes it started) by its pid."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait(timeout=KILL_WAIT_S)


class LocalLauncher:
    def start(self, spec: WorkerSpec) -> LocalHandle:
        argv = [sys.executable, "-m", "areal.runtime.worker.main", *spec.args]
        with open(spec.log_path, "ab") as out:
            # own session: the worker and whatever it starts (sandbox processes) die together
            # and die with the controller: a kill -9 of the run must not leave workers behind
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True, preexec_fn=_die_with_parent,
                                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
        return LocalHandle(process)


def _die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGKILL us when the controller dies."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)

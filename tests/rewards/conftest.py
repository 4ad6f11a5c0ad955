from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from areal.rewards import CodeTests, detect_layers
from areal.rewards.sandbox.layers import SANDBOX_UID


def sandbox_pids() -> set[int]:
    """Host pids of this test process's live sandbox processes: its descendants, never another run's.

    As root, untrusted code runs as a uid no account uses, so those are its processes. As any
    other user it runs as that user, so they are the processes in a PID namespace below ours
    (bubblewrap's init and everything under it). Zombies are left out: a dead namespace init
    waits there for the host's init to reap it. A process that left our tree could only be one
    whose namespace outlived its bubblewrap; the hostile tests look for those by their own
    random marker (`pids_with_marker`).
    """
    own_depth = len(_nspids(os.getpid()) or [0])
    pids = set()
    for pid in _descendants(os.getpid()):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields["State"].strip().startswith("Z"):
            continue
        if os.geteuid() == 0:
            sandboxed = int(fields["Uid"].split()[0]) == SANDBOX_UID
        else:
            sandboxed = len(fields.get("NSpid", "").split()) > own_depth
        if sandboxed:
            pids.add(pid)
    return pids


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        try:
            tasks = list(Path(f"/proc/{current}/task").iterdir())
            children = [int(c) for task in tasks for c in (task / "children").read_text().split()]
        except OSError:
            continue
        found.update(children)
        todo += children
    return found


def _nspids(pid: int) -> list[str] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), None)


def job_pids() -> set[int]:
    """Host pids of processes inside a job's PID namespace other than its PID 1 (the runner).

    Nesting is host > worker's bubblewrap > job: a ready jail waiting for its next job holds only
    its PID 1, so anything else there is a program's process, alive or left behind.
    """
    own_depth = len(_nspids(os.getpid()) or [0])
    pids = set()
    for pid in sandbox_pids():
        nspid = _nspids(pid)
        if nspid is not None and len(nspid) >= own_depth + 2 and nspid[-1] != "1":
            pids.add(pid)
    return pids


def pids_with_marker(marker: str) -> set[int]:
    pids = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                pids.add(int(entry.name))
        except OSError:
            continue
    return pids


class ProcessWatch:
    """Samples the host's sandbox processes while a run is in flight (observation, not sync)."""

    def __init__(self, marker: str | None = None) -> None:
        self.marker = marker
        self.seen_marker: set[int] = set()
        self.max_sandbox_procs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(0.02):
            self.max_sandbox_procs = max(self.max_sandbox_procs, len(sandbox_pids()))
            if self.marker:
                self.seen_marker |= pids_with_marker(self.marker)

    def __enter__(self) -> ProcessWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.fixture(scope="module")
def sandbox() -> Iterator[CodeTests]:
    layers = detect_layers()
    if layers.missing:
        pytest.skip(f"full sandbox unavailable here: {layers.describe()}")
    with CodeTests(timeout_s=1.0, memory_mb=256, workers=2) as scorer:
        yield scorer
        workers = worker_pids(scorer)
    assert [pid for pid in workers if host_pid_alive(pid)] == [], "sandbox workers outlived close()"


@pytest.fixture(scope="module")
def solo() -> Iterator[CodeTests]:
    """One warm worker, nothing reused: consecutive programs run on the same worker, one after another."""
    layers = detect_layers()
    if layers.missing:
        pytest.skip(f"full sandbox unavailable here: {layers.describe()}")
    with CodeTests(timeout_s=1.0, memory_mb=256, workers=1, remember=0) as scorer:
        assert scorer(["print(1)"], [{"kind": "stdio", "inputs": [""], "outputs": ["1"]}])[0].reward == 1.0
        yield scorer
        workers = worker_pids(scorer)
    assert [pid for pid in workers if host_pid_alive(pid)] == [], "sandbox workers outlived close()"


def wait_for(predicate, timeout_s: float = 10.0) -> None:
    """Poll host state (pids, kernel memory) until `predicate` holds; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    tick = threading.Event()
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for the sandbox"
        tick.wait(0.01)


def worker_pids(scorer: CodeTests) -> set[int]:
    """Host pids of the scorer's live sandbox workers (none before its first program)."""
    return set() if scorer._pool is None else scorer._pool.pids()


def run_one(scorer: CodeTests, program: str, tests: dict):
    (result,) = scorer([program], [tests])
    return result


def host_pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# the paths a program can run on; the first two take worker cgroups where the machine gives them
PATHS = ("pooled", "one-shot", "pooled, no cgroup", "plain")


def path_scorer(path: str, **kw) -> CodeTests:
    """A scorer that runs programs on `path` (skips where this machine cannot give it)."""
    layers = detect_layers()
    if layers.missing:
        pytest.skip(f"full sandbox unavailable here: {layers.describe()}")
    if path == "pooled" and layers.cgroup is None:
        pytest.skip(f"no worker cgroups here: {layers.cgroup_problem}")
    scorer = CodeTests(workers=1, remember=0, pooled=path != "one-shot", allow_weaker=path == "plain",
                       **{"timeout_s": 1.0, "memory_mb": 256, **kw})
    if path == "pooled, no cgroup":
        scorer._layers = dataclasses.replace(layers, cgroup=None, cgroup_problem="off for this test")
    elif path == "plain":
        scorer._layers = dataclasses.replace(layers, bwrap=None, namespaces=False, problem="plain path for this test")
    return scorer


@pytest.fixture(scope="module", params=PATHS)
def each_path(request) -> Iterator[CodeTests]:
    """The same tests on every path (module-wide: one scorer per path)."""
    with path_scorer(request.param) as scorer:
        yield scorer


# what a hostile program prints of its `routes` (name -> call), each "name:denied" or "name:open"
TRY_ROUTES = """
def call(result):
    if result < 0:
        raise OSError(ctypes.get_errno(), "refused")

def outcome(route):
    try:
        route()
    except OSError:
        return "denied"
    return "open"

outcomes = " ".join(f"{name}:{outcome(route)}" for name, route in routes.items())
"""

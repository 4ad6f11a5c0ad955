"""The worker pool: lazy start, a fresh jail per program on a reused worker, broken workers replaced."""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import signal
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from areal.rewards import CodeTests, detect_layers
from areal.rewards.sandbox import pool as sandbox_pool
from areal.rewards.sandbox.limits import Limits
from tests.rewards.conftest import (
    host_pid_alive,
    job_pids,
    path_scorer,
    pids_with_marker,
    run_one,
    wait_for,
    worker_pids,
)

MARKER = f"areal-pool-{uuid.uuid4().hex[:12]}"
PLACES = ("/", "/tmp", "/dev", "/dev/shm", ".")
HOSTILE = f"""
import ctypes, os, socket, sys
wrote = []
for place in {PLACES!r}:
    try:
        with open(os.path.join(place, {MARKER!r}), "w") as f:
            f.write("left behind")
        wrote.append(place)
    except OSError:
        pass
segment = ctypes.CDLL(None).shmget(0, 4096, 0o1600)  # IPC_PRIVATE, IPC_CREAT: outlives its creator
listener = socket.socket(socket.AF_UNIX)
listener.bind("\\0" + {MARKER!r})
listener.listen()
listener.set_inheritable(True)
if os.fork() == 0:
    try:
        os.setsid()
    except PermissionError:
        pass
    os.execv(sys.executable, [sys.executable, "-c", "import signal; signal.pause()", {MARKER!r}])
print(*wrote, "shm" if segment >= 0 else "no-shm")
"""
PROBE = f"""
import os, socket
found = [os.path.join(p, n) for p in {PLACES!r} for n in os.listdir(p) if {MARKER!r} in n]
with open("/proc/sysvipc/shm") as f:
    segments = len(f.read().splitlines()) - 1
try:
    socket.socket(socket.AF_UNIX).connect("\\0" + {MARKER!r})
    listener = "reachable"
except OSError:
    listener = "gone"
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
caps = {{status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd")}}
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print(found, segments, listener, caps, status["NoNewPrivs"].strip(), pids)
"""
CLEAN = "[] 0 gone {'0000000000000000'} 1 [1, 2]"  # PID 1 is the runner, 2 the program
SLEEPER = (
    "import os, sys\n"
    f"os.execv(sys.executable, [sys.executable, '-c', 'import signal; signal.pause()', {MARKER!r}])\n"
)
FAKE_WORKER = """
import os, struct, sys
def send(body):
    os.write(1, struct.pack(">I", len(body)) + body)
os.read(0, 1 << 20)
send(b'{"event": "hello"}')
os.read(0, 1 << 20)
sys.stderr.write("fake worker: got a job\\n")
sys.stderr.flush()
ACTION
os.read(0, 1)
"""
ONE = {"kind": "stdio", "inputs": [""], "outputs": ["1"]}


@pytest.fixture
def full_sandbox():
    layers = detect_layers()
    if layers.missing:
        pytest.skip(f"full sandbox unavailable here: {layers.describe()}")


def test_hostile_leftovers_are_gone_before_the_next_job_on_the_same_worker(solo):
    before = worker_pids(solo)
    # SysV shared memory is denied by the seccomp filter; where the filter is off, a segment is made
    shm = "shm" if detect_layers().seccomp else "no-shm"
    hostile = run_one(solo, HOSTILE, {"kind": "stdio", "inputs": [""], "outputs": [f"/tmp /dev/shm . {shm}"]})
    assert hostile.reward == 1.0, hostile  # it did write, listen and fork: the probe means something
    assert (pids_with_marker(MARKER), job_pids()) == (set(), set())
    probe = run_one(solo, PROBE, {"kind": "stdio", "inputs": [""], "outputs": [CLEAN]})
    assert probe.reward == 1.0, probe.detail
    assert worker_pids(solo) == before  # the same worker ran both


def own_children() -> set[int]:
    tasks = Path(f"/proc/{os.getpid()}/task").iterdir()
    return {int(pid) for task in tasks for pid in (task / "children").read_text().split()}


def test_no_process_starts_before_the_first_program_and_close_ends_them_all(full_sandbox):
    baseline = own_children()
    scorer = CodeTests(timeout_s=1.0, workers=2)
    assert (worker_pids(scorer), own_children()) == (set(), baseline)
    with scorer:
        assert [r.reward for r in scorer(["print(1)"] * 4, [ONE] * 4)] == [1.0] * 4
        workers = worker_pids(scorer)
        assert 1 <= len(workers) <= 2
        assert own_children() == baseline | workers
    assert [pid for pid in workers if host_pid_alive(pid)] == []
    assert own_children() == baseline


def test_a_worker_killed_mid_program_fails_it_as_killed_and_a_fresh_worker_runs_the_next(full_sandbox):
    with CodeTests(timeout_s=5.0, workers=1, remember=0) as scorer, ThreadPoolExecutor(1) as caller:
        run_one(scorer, "print(1)", ONE)
        (old,) = worker_pids(scorer)
        pending = caller.submit(run_one, scorer, SLEEPER, ONE)
        wait_for(lambda: pids_with_marker(MARKER) != set())
        os.kill(old, signal.SIGKILL)
        killed = pending.result(timeout=30)
        assert (killed.reward, killed.reason) == (0.0, "killed")
        assert killed.detail.startswith("sandbox worker died")
        wait_for(lambda: pids_with_marker(MARKER) == set())
        assert run_one(scorer, "print(1)", ONE).reward == 1.0
        assert worker_pids(scorer) not in (set(), {old})


@pytest.mark.parametrize(
    ("action", "reason", "detail"),
    [
        ("os.write(1, b'\\x00\\x00\\x00\\x05hello')", "sandbox_error", "sandbox worker sent garbage: "),
        ("os.write(1, b'\\xff\\xff\\xff\\xff')", "sandbox_error", "sandbox worker sent a 4294967295-byte frame"),
        ("os._exit(3)", "killed", "sandbox worker died: fake worker: got a job"),
        ("pass", "timeout", "sandbox worker gave no answer in time: fake worker: got a job"),
    ],
)
def test_a_worker_that_misbehaves_is_killed_and_its_program_reported(monkeypatch, action, reason, detail):
    """The pool's supervision of its workers, with a fake worker in a plain process: no bubblewrap needed."""
    monkeypatch.setattr(sandbox_pool, "BOOT_SOURCE", FAKE_WORKER.replace("ACTION", action))
    monkeypatch.setattr(sandbox_pool, "JOB_SLACK_S", 0.0)
    monkeypatch.setattr(sandbox_pool, "GRACE_S", 0.2)
    plain = dataclasses.replace(detect_layers(), bwrap=None, namespaces=False, problem="a fake worker")
    baseline = own_children()
    pool = sandbox_pool.SandboxPool(plain, Limits(timeout_s=0.1), size=1)
    try:
        run = pool.run({"kind": "stdio", "code": "print(1)", "inputs": [""], "fn_name": None})
        assert run.broken is not None and run.broken[0] == reason
        assert run.broken[1].startswith(detail)
        assert (pool.pids(), own_children()) == (set(), baseline)
    finally:
        pool.close()


ZOMBIE_COUNT = """
import ctypes, os, sys
from pathlib import Path
from areal.rewards import CodeTests

ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come to us, as to PID 1 in a container


def zombies():
    tasks = Path(f"/proc/{os.getpid()}/task").iterdir()
    children = [pid for task in tasks for pid in (task / "children").read_text().split()]
    return [pid for pid in children if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"]


for pooled in (False, True):
    with CodeTests(timeout_s=1.0, workers=1, pooled=pooled, remember=0) as scorer:
        for _ in range(3):
            assert scorer(["print(1)"], [{"kind": "stdio", "inputs": [""], "outputs": ["1"]}])[0].reward == 1.0
print(len(zombies()))
"""


def test_starting_and_closing_sandboxes_leaves_no_zombie_for_the_init_to_reap(full_sandbox):
    """In a fresh interpreter that adopts orphans as a container's PID 1 would: none may be left to reap."""
    paths = [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    done = subprocess.run([sys.executable, "-c", ZOMBIE_COUNT], capture_output=True, text=True, timeout=60, env=env)
    assert (done.returncode, done.stdout.strip()) == (0, "0"), done.stderr[-2000:]


def children(pid: int) -> list[int]:
    try:
        return [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]
    except OSError:
        return []


def stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat from its third field on (state, ppid, ...), [] once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def zombie(pid: int) -> bool:
    return stat_fields(pid)[:1] == ["Z"]


def parent_of(pid: int) -> int:
    return int(stat_fields(pid)[1])


def zombies_under(pid: int) -> list[int]:
    """Descendants of `pid` that have exited and wait to be reaped."""
    found, todo = [], [pid]
    while todo:
        below = children(todo.pop())
        found += [child for child in below if zombie(child)]
        todo += below
    return found


PTRACE_SEIZE, WALL = 0x4206, 0x40000000


@pytest.mark.parametrize("path", ["pooled", "pooled, no cgroup"])
def test_a_runner_that_exits_after_its_answer_is_reaped_without_waiting_for_the_next_job(path):
    """The host traces the program's sleeper, so its job's PID 1 (the runner) outlives the answer; once the
    host lets it go, the runner exits, and the worker's server must reap it then, not at its next job."""
    libc = ctypes.CDLL(None, use_errno=True)
    # 0.5 s: the answer comes after the test's backstop (2.5 s), a second, and 2 s waiting for PID 1
    with path_scorer(path, timeout_s=0.5) as scorer, ThreadPoolExecutor(1) as caller:
        run_one(scorer, "print(1)", ONE)  # a warm worker
        (worker,) = worker_pids(scorer)
        pending = caller.submit(run_one, scorer, SLEEPER, ONE)
        seen: set[int] = set()
        wait_for(lambda: seen.update(pids_with_marker(MARKER)) or seen)
        (sleeper,) = seen
        if libc.ptrace(PTRACE_SEIZE, sleeper, 0, 0) != 0:
            err = ctypes.get_errno()
            assert err == errno.EPERM, os.strerror(err)
            pytest.skip("this process may not trace the sandbox's processes here")
        try:
            runner = parent_of(sleeper)  # PID 1 of its job, started by the server
            (server,) = children(worker)
            assert parent_of(runner) == server
            result = pending.result(timeout=60)
            # the server has answered and started the next job's runner, while this one still dies
            wait_for(lambda: any(c != runner and not zombie(c) for c in children(server)))
        finally:
            os.waitpid(sleeper, WALL)  # as its tracer: now the job's namespace can finish dying
        assert (result.reward, result.reason) == (0.0, "timeout")
        wait_for(lambda: job_pids() == set() and zombies_under(worker) == [])


NO_SUCH_SYSCALL = 4000  # unassigned on every architecture: the kernel answers ENOSYS, as a filter refusing it does


def test_a_refused_clone3_falls_back_to_clone_and_a_refused_clone_is_named(monkeypatch):
    """Container seccomp profiles refuse clone3 with ENOSYS (its flags sit in memory a filter cannot read) and
    allow clone: the server then starts each job's runner with clone. Refused both ways, the worker says so."""
    source = sandbox_pool.BOOT_SOURCE
    assert source.count("SYS_CLONE3 = 435 ") == 1 and source.count("SYS_CLONE = {") == 1
    without_clone3 = source.replace("SYS_CLONE3 = 435 ", f"SYS_CLONE3 = {NO_SUCH_SYSCALL} ")
    program, tests = "print(input())", {"kind": "stdio", "inputs": ["7"], "outputs": ["7"]}
    monkeypatch.setattr(sandbox_pool, "BOOT_SOURCE", without_clone3)
    with path_scorer("pooled, no cgroup") as scorer:
        fallback = run_one(scorer, program, tests)
        again = run_one(scorer, program, tests)  # the next job's runner, started the same way
    if os.uname().machine in ("x86_64", "aarch64", "riscv64"):
        assert (fallback.reward, again.reward) == (1.0, 1.0), (fallback, again)
    monkeypatch.setattr(sandbox_pool, "BOOT_SOURCE",
                        without_clone3.replace("SYS_CLONE = {", f"SYS_CLONE = {NO_SUCH_SYSCALL} or {{"))
    with path_scorer("pooled, no cgroup") as scorer:
        refused = run_one(scorer, program, tests)
    assert (refused.reward, refused.reason) == (0.0, "sandbox_error"), refused
    assert "cannot start a job in fresh namespaces (clone): Function not implemented" in refused.detail

"""The verdict cannot be forged from inside the jail: not through the record channel, the clock or the status.

Each attack is a program a policy could learn to write: it takes what the harness's memory holds
(the job, in its caller's frame), then tries every way to reach the channel that carries the
verdict or the process that keeps the clock. A function that returns 0 must score 0, a program
slower than its limit must time out, and nothing from inside may claim a machinery failure.
"""

from __future__ import annotations

import pytest

from areal.rewards import CodeTests, detect_layers
from areal.rewards.code_reward import _verdicts
from areal.rewards.sandbox.layers import SandboxRun
from tests.rewards.conftest import run_one

ADD = {"kind": "call", "fn_name": "add", "inputs": [[1, 2], [3, 4]], "outputs": [3, 7]}

# the job as the harness's frames hold it, and records for every test in the old channel format
FORGER = """
import ctypes, json, os, stat, sys

def find_job():
    frame = sys._getframe()
    while frame is not None:
        for value in list(frame.f_locals.values()):
            if isinstance(value, dict) and "inputs" in value:
                return value
        frame = frame.f_back
    return {"inputs": [[1, 2], [3, 4]]}

job = find_job()
records = [
    {"i": i, "status": STATUS, "out": json.dumps(sum(args)), "nonce": job.get("nonce", "")}
    for i, args in enumerate(job["inputs"])
]
ready = {"event": "ready", "nonce": job.get("nonce", "")}
FORGED = "".join(json.dumps(r) + "\\n" for r in [ready, *records]).encode()

def write_all(fd):
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.write(fd, FORGED)
    except OSError:
        pass

ROUTE

def add(a, b):
    return 0
"""
THROUGH_PROC = """
for pid in (1, os.getppid()):
    for fd in range(64):
        try:
            write_all(os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
"""
THROUGH_PIDFD_GETFD = """
libc = ctypes.CDLL(None, use_errno=True)
for pid in (1, os.getppid()):
    pidfd = libc.syscall(434, pid, 0)  # pidfd_open
    for fd in range(64):
        stolen = libc.syscall(438, pidfd, fd, 0)  # pidfd_getfd
        if stolen >= 0:
            write_all(stolen)
"""


def forger(route: str, status: str = "ok") -> str:
    return FORGER.replace("ROUTE", route).replace("STATUS", repr(status))


@pytest.fixture(scope="module")
def one_shot():
    """One sandbox per program (pooled=False): the other path a record could be forged on."""
    layers = detect_layers()
    if layers.missing:
        pytest.skip(f"full sandbox unavailable here: {layers.describe()}")
    with CodeTests(timeout_s=1.0, memory_mb=256, workers=1, pooled=False, remember=0) as scorer:
        yield scorer


def test_records_written_into_the_runners_fds_through_proc_are_not_a_pass(sandbox):
    result = run_one(sandbox, forger(THROUGH_PROC), ADD)
    assert (result.reward, result.reason, result.detail) == (0.0, "wrong_answer", "expected 3, got 0")


def test_records_written_through_fds_taken_with_pidfd_getfd_are_not_a_pass_in_the_one_shot_path(one_shot):
    result = run_one(one_shot, forger(THROUGH_PIDFD_GETFD), ADD)
    assert (result.reward, result.reason, result.detail) == (0.0, "wrong_answer", "expected 3, got 0")


@pytest.mark.parametrize("route", [THROUGH_PROC, THROUGH_PIDFD_GETFD], ids=["proc", "pidfd_getfd"])
def test_a_forged_sandbox_error_is_scored_zero_not_dropped(sandbox, route):
    result = run_one(sandbox, forger(route, status="sandbox_error"), ADD)
    assert (result.reward, result.reason) == (0.0, "wrong_answer")


def test_no_route_from_the_program_reaches_the_runner(sandbox):
    """The runner holds the channel and keeps the clock: fds, memory, ptrace and signals all fail."""
    probe = """
import ctypes, errno, os, signal
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(8)
iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)

def outcome(call):
    try:
        result = call()
    except OSError:
        return "denied"
    return "denied" if isinstance(result, int) and result < 0 else "open"

routes = {
    "proc_fd": lambda: os.open("/proc/1/fd/3", os.O_WRONLY),
    "proc_fd_list": lambda: os.listdir("/proc/1/fd"),
    "proc_mem": lambda: os.open("/proc/1/mem", os.O_RDWR),
    "proc_environ": lambda: os.open("/proc/1/environ", os.O_RDONLY),
    "pidfd_getfd": lambda: libc.syscall(438, libc.syscall(434, 1, 0), 3, 0),
    "ptrace_attach": lambda: libc.ptrace(16, 1, 0, 0),
    "ptrace_seize": lambda: libc.ptrace(0x4206, 1, 0, 0),
    "process_vm_readv": lambda: libc.syscall(310 if os.uname().machine == "x86_64" else 270, 1, iov, 1, iov, 1, 0),
}
print(" ".join(f"{name}:{outcome(call)}" for name, call in routes.items()))
"""
    names = ["proc_fd", "proc_fd_list", "proc_mem", "proc_environ", "pidfd_getfd", "ptrace_attach",
             "ptrace_seize", "process_vm_readv"]
    expected = " ".join(f"{name}:denied" for name in names)
    result = run_one(sandbox, probe, {"kind": "stdio", "inputs": [""], "outputs": [expected]})
    assert result.reward == 1.0, result.detail


FREEZER = """
import ctypes, os, select, signal, time
libc = ctypes.CDLL(None, use_errno=True)
runner, me = os.getppid(), os.getpid()
if os.fork() == 0:
    try:
        os.setsid()
    except OSError:
        pass
    if libc.ptrace(16, runner, 0, 0) == 0:  # PTRACE_ATTACH: the runner stops, its clock with it
        os.waitpid(runner, 0)
        select.select([os.pidfd_open(me)], [], [])  # readable once the program has exited
        libc.ptrace(17, runner, 0, 0)  # PTRACE_DETACH once the answer is in the pipe
    for target in (runner, -1):
        try:
            os.kill(target, signal.SIGSTOP)
        except OSError:
            pass
    os._exit(0)

def add(a, b):
    end = time.monotonic() + 1.6
    while time.monotonic() < end:
        pass
    return a + b
"""


def test_a_program_that_freezes_its_runner_still_times_out(sandbox):
    # 1.6 s per test under a 1 s limit (per-process CPU limit 2 s): right, but too slow
    result = run_one(sandbox, FREEZER, {**ADD, "inputs": ADD["inputs"][:1], "outputs": ADD["outputs"][:1]})
    assert (result.reward, result.reason) == (0.0, "timeout")


@pytest.mark.parametrize("status", ["sandbox_error", "check_failed", "no such status", None])
def test_a_status_from_inside_never_becomes_a_machinery_failure(status):
    run = SandboxRun(ready=True, records={0: {"status": status, "detail": "trust me"}})
    ((reason, detail),) = _verdicts(run, "call", [3])
    assert reason in ("crash", "killed")
    assert reason != "sandbox_error"

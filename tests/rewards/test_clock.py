"""The clock under attack (issue #37): a test's CPU, its runner and its deadline, on every sandbox path.

A policy optimised against the reward finds any way to get more CPU than its limit or to slow
the process that keeps its clock. Each defence is checked on every path it applies to: pooled
workers with cgroups (where this machine gives them), one sandbox per program, pooled without
cgroups, and the plain opt-in path (`conftest.PATHS`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from areal.rewards.sandbox.limits import Limits
from tests.rewards.conftest import PATHS, TRY_ROUTES, job_pids, path_scorer, pids_with_marker, run_one, wait_for

DONE = {"kind": "stdio", "inputs": [""], "outputs": ["done"]}
# 1.5 s of CPU in children of 50 ms each, their parent letting the kernel reap them (the filter
# refuses that: then they wait as zombies until reaped), while the first process stays runnable
# on the same CPU without using it, so that its wall time is queued and forgiven
HIDDEN_WORK = """
import os, signal, time
try:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
except OSError:
    pass
DEMOTE
os.sched_setaffinity(0, {0})
r, w = os.pipe()
if os.fork() == 0:
    for _ in range(30):
        if os.fork() == 0:
            end = time.process_time() + 0.05
            while time.process_time() < end:
                pass
            os._exit(0)
        try:
            os.wait()
        except ChildProcessError:
            pass
    os.write(w, b"x")
    os._exit(0)
os.set_blocking(r, False)
while True:
    try:
        os.read(r, 1)
        break
    except BlockingIOError:
        os.sched_yield()
print("done")
"""


def hidden_work(demote: bool = False) -> str:
    return HIDDEN_WORK.replace("DEMOTE", "os.nice(19)" if demote else "")


def filter_off(scorer):
    scorer._layers = dataclasses.replace(scorer.layers, seccomp="off for this test")
    return scorer


# a short limit: its backstop (3 x limit + 1 s) is 7 limits away, so even a loaded machine's
# share of a CPU reaches the CPU limit first, and the detail says which clock ended the test
SHORT_S = 0.25


@pytest.mark.parametrize("path", PATHS)
def test_cpu_of_every_process_a_test_started_counts_reaped_or_not(path):
    with path_scorer(path, timeout_s=SHORT_S) as scorer:
        result = run_one(scorer, hidden_work(), DONE)
    assert (result.reward, result.reason) == (0.0, "timeout")
    assert "s of CPU" in result.detail, result.detail  # the CPU count caught it, not the wall clock


@pytest.mark.parametrize("path", ["pooled", "one-shot"])
def test_the_worker_cgroup_counts_children_the_kernel_reaped(path):
    # with the filter off the kernel does reap them, uncounted by any process: the cgroup still counts them
    scorer = path_scorer(path, timeout_s=SHORT_S)
    if scorer.layers.cgroup is None:
        pytest.skip(f"no worker cgroups here: {scorer.layers.cgroup_problem}")
    with filter_off(scorer) as scorer:
        result = run_one(scorer, hidden_work(), DONE)
    assert (result.reward, result.reason) == (0.0, "timeout")
    assert "s of CPU" in result.detail, result.detail


@pytest.mark.parametrize("path", ["pooled, no cgroup", "plain"])
def test_a_first_process_that_demotes_itself_is_not_forgiven_its_queue(path):
    # the program where nothing counts the hidden CPU: its nice-19 first process queues behind
    # the hidden work, which the wall clock forgave as a neighbour's load
    with filter_off(path_scorer(path)) as scorer:
        result = run_one(scorer, hidden_work(demote=True), DONE)
    assert (result.reward, result.reason, result.detail) == (0.0, "timeout", "still running after 1 s")


DEMOTE_THE_RUNNER = """
import ctypes, os, resource
libc = ctypes.CDLL(None, use_errno=True)
runner = os.getppid()
x86 = os.uname().machine == "x86_64"
sched_attr = (ctypes.c_uint32 * 12)(48, 5)  # size, SCHED_IDLE

routes = {
    "sched_setscheduler": lambda: os.sched_setscheduler(runner, os.SCHED_IDLE, os.sched_param(0)),
    "sched_setattr": lambda: call(libc.syscall(314 if x86 else 274, runner, sched_attr, 0)),
    "setpriority": lambda: os.setpriority(os.PRIO_PROCESS, runner, 19),
    "setpriority_group": lambda: os.setpriority(os.PRIO_PGRP, os.getpgid(runner), 19),
    "setpriority_user": lambda: os.setpriority(os.PRIO_USER, os.getuid(), 19),
    "sched_setaffinity": lambda: os.sched_setaffinity(runner, {0}),
    "prlimit": lambda: resource.prlimit(runner, resource.RLIMIT_NOFILE, (8, 8)),
    "ioprio_set": lambda: call(libc.syscall(251 if x86 else 30, 1, runner, (3 << 13) | 7)),  # idle class
}
""" + TRY_ROUTES + """
fields = open(f"/proc/{runner}/stat").read().rsplit(")", 1)[1].split()
print(outcomes, "nice", fields[16], "policy", fields[38])
"""
ROUTES = ("sched_setscheduler", "sched_setattr", "setpriority", "setpriority_group", "setpriority_user",
          "sched_setaffinity", "prlimit", "ioprio_set")


def test_no_program_can_demote_pin_or_relimit_its_runner(each_path):
    untouched = f"nice {os.getpriority(os.PRIO_PROCESS, 0)} policy {os.sched_getscheduler(0)}"
    expected = " ".join(f"{route}:denied" for route in ROUTES) + " " + untouched
    result = run_one(each_path, DEMOTE_THE_RUNNER, {"kind": "stdio", "inputs": [""], "outputs": [expected]})
    assert result.reward == 1.0, result.detail


MARKER = f"areal-clock-{uuid.uuid4().hex[:12]}"
# the second of four tests becomes a sleeper carrying MARKER, so the host can find it and its runner
STALLER = f"""
import os, sys
word = input()
if word == "stall":
    os.execv(sys.executable, [sys.executable, "-c", "import signal; signal.pause()", {MARKER!r}])
print(word)
"""
FOUR = {"kind": "stdio", "inputs": ["a", "stall", "b", "c"], "outputs": ["a", "-", "b", "c"]}
PTRACE_SEIZE, WALL = 0x4206, 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.parametrize(("path", "traced"), [("pooled", True), ("pooled, no cgroup", True), ("one-shot", False)])
def test_a_runner_that_stops_reporting_ends_its_test_as_a_timeout_in_bounded_time(path, traced):
    """The host freezes the runner mid-test (as a starved one would be); traced, the sleeper's death
    waits for the host to reap it, so the job's PID 1 cannot exit either."""
    limits = Limits(timeout_s=1.0)
    with path_scorer(path) as scorer, ThreadPoolExecutor(1) as caller:
        run_one(scorer, "print(1)", {"kind": "stdio", "inputs": [""], "outputs": ["1"]})  # a warm worker
        started = time.monotonic()
        pending = caller.submit(run_one, scorer, STALLER, FOUR)
        wait_for(lambda: pids_with_marker(MARKER) != set())
        (sleeper,) = pids_with_marker(MARKER)
        try:
            if traced:
                assert _libc.ptrace(PTRACE_SEIZE, sleeper, 0, 0) == 0, os.strerror(ctypes.get_errno())
            os.kill(parent_of(sleeper), signal.SIGSTOP)
            result = pending.result(timeout=60)
            took = time.monotonic() - started
        finally:
            if traced:
                os.waitpid(sleeper, WALL)  # as its tracer: now the namespace can finish dying
        wait_for(lambda: job_pids() == set())
    # the first test's record is kept; the frozen one and those after it are timeouts, not dropped
    assert (result.reward, result.passed, result.reason) == (0.25, 1, "timeout"), result
    # the server's deadline is one test's backstop and a second past the last record, then it
    # waits at most 2 s for PID 1 (the rest: a loaded machine); the job's whole budget is four backstops
    assert took < limits.backstop_s + 1 + 2 + 5, took

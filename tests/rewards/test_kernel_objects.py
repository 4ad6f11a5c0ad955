"""Kernel resources no cgroup pays for (issue #57): ptys, Linux AIO, per-user objects, the runner's autogroup, dentries.

Each is checked on every path it applies to (`conftest.PATHS`); the plain opt-in path shares the
host's /dev and /proc, so what only a jail can give is skipped there with the reason.
"""

from __future__ import annotations

import os

import pytest

from tests.rewards.conftest import PATHS, TRY_ROUTES, path_scorer, run_one, wait_for

JAILED = [path for path in PATHS if path != "plain"]
HOST_DEV = "the plain path runs in the host's /dev and /proc: only a jail can seal them (the report says so)"

PTYS = """
import os
routes = {"openpty": os.openpty, "ptmx": lambda: os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY)}
""" + TRY_ROUTES + """
print(outcomes)
"""


@pytest.mark.parametrize("path", JAILED)
def test_a_program_gets_no_pseudo_terminal(path):
    expected = "openpty:denied ptmx:denied"
    with path_scorer(path) as scorer:
        result = run_one(scorer, PTYS, {"kind": "stdio", "inputs": [""], "outputs": [expected]})
    assert result.reward == 1.0, result.detail


AIO = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
x86 = os.uname().machine == "x86_64"
context = ctypes.c_ulong(0)
routes = {"io_setup": lambda: call(libc.syscall(206 if x86 else 0, 64, ctypes.byref(context)))}
""" + TRY_ROUTES + """
print(outcomes)
"""


@pytest.mark.parametrize("path", PATHS)
def test_linux_aio_is_denied(path):
    with path_scorer(path) as scorer:
        result = run_one(scorer, AIO, {"kind": "stdio", "inputs": [""], "outputs": ["io_setup:denied"]})
    assert result.reward == 1.0, result.detail


USER_OBJECTS = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
timer = ctypes.c_void_p()
routes = {"inotify": lambda: call(libc.inotify_init1(0)),
          "fanotify": lambda: call(libc.fanotify_init(0x200, 0)),  # FAN_REPORT_FID: open to any user
          "timer": lambda: call(libc.timer_create(1, None, ctypes.byref(timer)))}
""" + TRY_ROUTES + """
print(outcomes)
"""


@pytest.mark.parametrize("path", PATHS)
def test_per_user_kernel_objects_are_denied(path):
    # each of these is open to an unprivileged process outside the sandbox (the runner's own user)
    with path_scorer(path) as scorer:
        result = run_one(scorer, USER_OBJECTS, {"kind": "stdio", "inputs": [""],
                                                "outputs": ["inotify:denied fanotify:denied timer:denied"]})
    assert result.reward == 1.0, result.detail


# the first process tries to become dumpable and to write its autogroup's nice (its /proc files are
# root's while it is not dumpable), then execs an interpreter, which makes any process dumpable
# again, and tries once more; last, it reads the nice of its runner's autogroup
AUTOGROUP = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)

def demote():
    with open("/proc/self/autogroup", "w") as f:
        f.write("19")

routes = {"dumpable": lambda: call(libc.prctl(4, 1, 0, 0, 0)), "autogroup": demote}
""" + TRY_ROUTES + """
AFTER_EXEC = '''
import os, sys
try:
    with open("/proc/self/autogroup", "w") as f:
        f.write("19")
    own = "open"
except OSError:
    own = "denied"
nice = open(f"/proc/{os.getppid()}/autogroup").read().split()[-1]
print(sys.argv[1], f"exec_autogroup:{own}", "runner nice", nice)
'''
os.execv(sys.executable, [sys.executable, "-c", AFTER_EXEC, outcomes])
"""


@pytest.mark.parametrize("path", PATHS)
def test_no_program_can_demote_its_runner_through_their_autogroup(path):
    if not os.path.exists("/proc/self/autogroup"):
        pytest.skip("this kernel has no autogroup scheduling (CONFIG_SCHED_AUTOGROUP)")
    # the plain path's /proc is the host's: the program may write its own autogroup there, never the runner's
    own = "open" if path == "plain" else "denied"
    expected = f"dumpable:denied autogroup:denied exec_autogroup:{own} runner nice 0"
    with path_scorer(path) as scorer:
        result = run_one(scorer, AUTOGROUP, {"kind": "stdio", "inputs": [""], "outputs": [expected]})
    assert result.reward == 1.0, result.detail


# failed lookups of long names under the read-only /usr: each leaves a negative dentry (~0.5 KB)
# in the host's cache, which outlives the job (names new to it: those it holds already cost nothing)
LOOKUPS = """
import os, time, uuid
name = "/usr/" + uuid.uuid4().hex + "q" * 160
n = 0
while time.process_time() < 0.8:
    try:
        os.stat(f"{name}{n}")
    except OSError:
        pass
    n += 1
print("done")
"""


def cgroup_kmem(scorer) -> int | None:
    """Kernel memory charged to the scorer's one worker's cgroup (v2: its slab), None where it has none."""
    workers = [] if scorer._pool is None else list(scorer._pool._live)
    if not workers or workers[0].cgroup is None:
        return None
    cgroup = workers[0].cgroup
    if cgroup.place.version == 1:
        return int((cgroup.dirs["memory"] / "memory.kmem.usage_in_bytes").read_text())
    stat = dict(line.split() for line in (cgroup.dirs["memory"] / "memory.stat").read_text().splitlines())
    return int(stat["slab"])


@pytest.mark.parametrize("path", PATHS)
def test_negative_dentries_a_test_leaves_count_against_its_memory_and_do_not_outlive_it(path):
    with path_scorer(path, memory_mb=64) as scorer:
        run_one(scorer, "print(1)", {"kind": "stdio", "inputs": [""], "outputs": ["1"]})  # a warm worker
        before = cgroup_kmem(scorer)
        result = run_one(scorer, LOOKUPS, {"kind": "stdio", "inputs": [""], "outputs": ["done"]})
        if before is not None:  # the pooled path with a cgroup: measured and reclaimed after the job
            # what the job held was 27 MB and more; what its namespaces' teardown frees a moment after the
            # answer (RCU, the kernel's net namespace cleanup) may still be charged as the job ends
            wait_for(lambda: cgroup_kmem(scorer) - before < 16 << 20, timeout_s=5)
    assert (result.reward, result.reason) == (0.0, "memory"), result
    assert "negative dentries" in result.detail, result.detail


@pytest.mark.parametrize("path", PATHS)
def test_the_report_says_how_each_defence_of_57_holds_on_the_path(path):
    with path_scorer(path) as scorer:
        report = scorer.layers.describe(scorer.limits)
    kernel = next(line for line in report.splitlines() if line.startswith("kernel objects: "))
    assert "Linux AIO, PR_SET_DUMPABLE, inotify, fanotify and POSIX timers denied" in kernel
    assert "each test in a session and autogroup of its own, apart from its runner" in kernel
    assert "negative dentries the machine gains while a test runs count 1 KiB each against its 256 MB" in kernel
    jailed = "no pseudo-terminals (/dev/pts sealed empty) and a read-only /proc in each job"
    assert (jailed in kernel) == (path != "plain")
    assert ("reclaimed past 8 MB" in kernel) == (scorer.layers.cgroup is not None and path != "plain")
    assert "the program is compiled in each test, under its limits, and its stderr counts against" in report
    assert "its runner's while it watches" in report
    assert ("reaps each job's runner as it exits" in report) == (path != "plain")

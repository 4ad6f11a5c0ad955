"""A job is bounded as a whole: its memory, its files, its processes and its CPU.

Programs run with memory_mb=256. Each hostile program reports how much it managed to take; it
passes its test only if it took more than its job may have, so a pass here is the sandbox failing.
Every scorer here runs without worker cgroups, even where the machine offers them: these bounds
must hold on the fallback (test_sandbox_cgroup.py checks the cgroups); the calls that would make
a pipe a memory store are checked refused on every path.
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Iterator

import pytest

from areal.rewards import CodeTests, detect_layers
from areal.rewards.sandbox.launch import as_uid
from areal.rewards.sandbox.layers import pipe_bytes_bound
from areal.rewards.sandbox.limits import Limits
from areal.rewards.sandbox.process import threads_of_uid
from tests.rewards.conftest import TRY_ROUTES, job_pids, path_scorer, run_one

HOLD_512_MB = {"kind": "stdio", "inputs": [""], "outputs": ["512"]}


def fallback(**kw) -> Iterator[CodeTests]:
    layers = detect_layers()
    if layers.missing:
        pytest.skip(f"full sandbox unavailable here: {layers.describe()}")
    with CodeTests(memory_mb=256, **kw) as scorer:
        scorer._layers = dataclasses.replace(layers, cgroup=None, cgroup_problem="off for this test")
        yield scorer


@pytest.fixture(scope="module")
def sandbox() -> Iterator[CodeTests]:
    yield from fallback(timeout_s=1.0, workers=2)


@pytest.fixture(scope="module")
def solo() -> Iterator[CodeTests]:
    yield from fallback(timeout_s=1.0, workers=1, remember=0)


@pytest.fixture(scope="module")
def roomy() -> Iterator[CodeTests]:
    """Time to fault in 512 MB of shared memory (slow on a loaded 2-core VM)."""
    yield from fallback(timeout_s=3.0, workers=1, remember=0)


# each takes up to 512 MB (twice the job's limit) in 8 MB pieces (under the file size limit)
# that no process keeps mapped, and prints how much it holds
MEMORY_ROUTES = {
    "memfd": """
fd = os.memfd_create("piece")
os.posix_fallocate(fd, 0, PIECE)
""",
    "sysv_shm": """
segment = libc.shmget(0, ctypes.c_size_t(PIECE), 0o1600)
if segment < 0:
    raise OSError(ctypes.get_errno(), "shmget")
base = libc.shmat(segment, None, 0)
if libc.madvise(ctypes.c_void_p(base), ctypes.c_size_t(PIECE), 23):  # MADV_POPULATE_WRITE
    raise OSError(ctypes.get_errno(), "shmat")
libc.shmdt(ctypes.c_void_p(base))
""",
    "dev_shm_file": """
fd = os.open(f"/dev/shm/piece{held}", os.O_CREAT | os.O_RDWR)
os.posix_fallocate(fd, 0, PIECE)
""",
    "tmp_file": """
fd = os.open(f"/tmp/piece{held}", os.O_CREAT | os.O_RDWR)
os.posix_fallocate(fd, 0, PIECE)
""",
}
HOLDER = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
PIECE = 8 << 20
held = 0
try:
    while held < 512:
        ROUTE
        held += 8
except (OSError, MemoryError):
    pass
print(held)
"""


@pytest.mark.parametrize("route", list(MEMORY_ROUTES))
def test_memory_no_process_maps_counts_against_the_job(roomy, route):
    body = MEMORY_ROUTES[route].strip().replace("\n", "\n        ")
    result = run_one(roomy, HOLDER.replace("ROUTE", body), HOLD_512_MB)
    assert result.reward == 0.0, f"{route}: held 512 MB under memory_mb=256"


MANY_PROCESSES = """
import os, signal
r, w = os.pipe()
for _ in range(8):
    if os.fork() == 0:
        try:
            block = b"x" * (180 << 20)  # written, so resident
            os.write(w, b"1")
        except MemoryError:
            os.write(w, b"0")
        signal.pause()
held = sum(os.read(r, 1) == b"1" for _ in range(8))
print(held * 180)
"""


def test_memory_spread_over_processes_counts_once_for_the_job(roomy):
    # 8 x 180 MB: each process stays under its own 256 MB, the job does not
    result = run_one(roomy, MANY_PROCESSES, {"kind": "stdio", "inputs": [""], "outputs": ["1440"]})
    assert (result.reward, result.reason) == (0.0, "memory")


HIDDEN_BEHIND_EXITED_LEADERS = """
import ctypes, os, signal, threading
libc = ctypes.CDLL(None)
libc.pthread_self.restype = ctypes.c_ulong
r, w = os.pipe()
for _ in range(4):
    if os.fork() == 0:
        leader = libc.pthread_self()
        def hold():
            libc.pthread_join(ctypes.c_ulong(leader), None)  # returns once the leader thread has exited
            block = b"x" * (150 << 20)
            os.write(w, b"1")
            signal.pause()
        threading.Thread(target=hold).start()
        libc.pthread_exit(None)  # the leader's status now shows no memory
held = sum(os.read(r, 1) == b"1" for _ in range(4))
print(held * 150)
"""


def test_memory_of_threads_whose_leader_exited_still_counts(roomy):
    result = run_one(roomy, HIDDEN_BEHIND_EXITED_LEADERS, {"kind": "stdio", "inputs": [""], "outputs": ["600"]})
    assert (result.reward, result.reason) == (0.0, "memory")


SOCKET_QUEUES = """
import os, signal, socket
r, w = os.pipe()
for _ in range(8):
    if os.fork() == 0:
        held, pairs = 0, []
        try:
            while held < 64 << 20:
                a, b = socket.socketpair()
                pairs.append((a, b))
                a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
                a.setblocking(False)
                try:
                    while True:
                        held += a.send(bytes(1 << 16))
                except BlockingIOError:
                    pass
        except OSError:
            pass
        os.write(w, b"%d," % held)
        signal.pause()
sizes = b""
while sizes.count(b",") < 8:
    sizes += os.read(r, 64)
print(min(sum(int(n) for n in sizes.split(b",")[:8]) >> 20, 512))
"""


def test_data_parked_in_socket_queues_counts_against_the_job(roomy):
    # 8 processes x 64 MB written to unix sockets and never read: kernel memory no process maps
    result = run_one(roomy, SOCKET_QUEUES, HOLD_512_MB)
    assert (result.reward, result.reason) == (0.0, "memory")


INODE_FLOOD = """
counts = []
for place in ("/tmp", "/dev/shm"):
    made = 0
    try:
        while made < 10000:
            open(f"{place}/f{made}", "w").close()
            made += 1
    except OSError:
        pass
    counts.append(made)
print(*counts)
"""


def test_a_job_cannot_fill_its_tmpfs_with_empty_files(sandbox):
    result = run_one(sandbox, INODE_FLOOD, {"kind": "stdio", "inputs": [""], "outputs": ["10000 10000"]})
    assert (result.reward, result.reason) == (0.0, "wrong_answer")


LEFT_RUNNING = """
import os, signal, sys
if input() == "spawn":
    if os.fork() == 0:
        DETACH
        while True:
            signal.pause()
    print("spawned")
else:
    others = sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid()))
    print("alone" if not others else f"others {others}")
"""
DETACH = {
    "setsid": "try:\n            os.setsid()\n        except OSError:\n            pass",
    "own_group": "os.setpgid(0, 0)",
    "double_fork": "if os.fork():\n            os._exit(0)",
}


@pytest.mark.parametrize("detach", list(DETACH))
def test_nothing_a_test_started_is_alive_when_the_next_test_starts(solo, detach):
    program = LEFT_RUNNING.replace("DETACH", DETACH[detach])
    result = run_one(solo, program, {"kind": "stdio", "inputs": ["spawn", "check"], "outputs": ["spawned", "alone"]})
    assert result.reward == 1.0, result.detail
    assert job_pids() == set()


BUSY_CHILDREN = """
import os
for _ in range(30):
    try:
        if os.fork() == 0:
            try:
                os.setsid()
            except OSError:
                pass
            while True:
                pass
    except OSError:
        break
while True:
    pass
"""
# ~0.3 s of CPU on this machine: well inside its 1 s limit when it gets a fair share of a core
NEIGHBOUR = "def work(n):\n    s = 0\n    for i in range(n):\n        s += i * i\n    return s % 7\n"
WORK = {"kind": "call", "fn_name": "work", "inputs": [[2_000_000]] * 3,
        "outputs": [sum(i * i for i in range(2_000_000)) % 7] * 3}


def test_a_correct_program_next_to_a_cpu_hog_still_passes(sandbox):
    hog_tests = {"kind": "stdio", "inputs": ["", "", ""], "outputs": ["", "", ""]}
    hog, neighbour = sandbox([BUSY_CHILDREN, NEIGHBOUR], [hog_tests, WORK])
    assert (hog.reward, hog.reason) == (0.0, "timeout")
    assert (neighbour.reward, neighbour.reason) == (1.0, None), neighbour.detail


PIPE_AMPLIFIERS = """
import ctypes, fcntl, mmap, os, tempfile
libc = ctypes.CDLL(None, use_errno=True)
r, w = os.pipe()
os.set_blocking(w, False)
huge = mmap.mmap(-1, 4 << 20)
huge[0] = 1
libc.madvise(ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(huge))), ctypes.c_size_t(4 << 20), 14)
iov = (ctypes.c_void_p * 2)(ctypes.addressof(ctypes.c_char.from_buffer(huge)), 1)  # one byte of a huge page
page, name = tempfile.mkstemp()  # its own file: on the plain path /tmp is the machine's
os.write(page, b"x" * 4096)
src = os.open(name, os.O_RDONLY)
os.unlink(name)
other_r, other_w = os.pipe()
os.write(other_w, b"x")

routes = {
    "vmsplice": lambda: call(libc.vmsplice(w, iov, 1, 0)),
    "splice": lambda: os.splice(src, w, 1),
    "tee": lambda: call(libc.tee(other_r, w, ctypes.c_size_t(1), 0)),
    "sendfile": lambda: os.sendfile(w, src, 0, 1),
    "F_SETPIPE_SZ": lambda: fcntl.fcntl(w, 1031, 1 << 20),
}
""" + TRY_ROUTES + """
print(outcomes)
"""


def test_no_call_puts_more_than_a_written_page_into_a_pipe_slot(each_path):
    expected = " ".join(f"{name}:denied" for name in ("vmsplice", "splice", "tee", "sendfile", "F_SETPIPE_SZ"))
    result = run_one(each_path, PIPE_AMPLIFIERS, {"kind": "stdio", "inputs": [""], "outputs": [expected]})
    assert result.reward == 1.0, result.detail


PIPE_FLOOD = """
import os, signal
r, w = os.pipe()
children = 0
for _ in range(14):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        children = -1
        break
    children += 1
held = 0
try:
    while True:
        a, b = os.pipe()
        os.set_blocking(b, False)
        try:
            while True:
                held += os.write(b, bytes(4096))
        except BlockingIOError:
            pass
        os.close(b)  # the read end alone keeps what was written
except OSError:
    pass
if children < 0:
    os.write(w, b"%d," % held)
    signal.pause()
reports = b""
while reports.count(b",") < children:
    reports += os.read(r, 64)
print((held + sum(int(n) for n in reports.split(b",")[:children])) >> 20)
"""


def test_pipes_hold_no_more_than_the_report_says_where_no_cgroup_counts_them(solo):
    # 15 processes fill a pipe per descriptor by write(), the one route left, and print the MB they hold
    result = run_one(solo, PIPE_FLOOD, HOLD_512_MB)
    assert (result.reward, result.reason) == (0.0, "wrong_answer"), result.detail
    held_mb = int(result.detail.rsplit("got '", 1)[1].split("\\n")[0])
    assert 16 <= held_mb <= pipe_bytes_bound(Limits(memory_mb=256)) >> 20
    assert f"at most {pipe_bytes_bound(Limits(memory_mb=256)) >> 20} MB" in solo.layers.describe(solo.limits)


FORKS_FOUR = """
import os
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
print("forked")
"""


def test_the_plain_path_forks_however_many_threads_its_account_already_runs():
    """Without a user namespace RLIMIT_NPROC counts every thread of the uid: an account running a
    trainer's threads would leave a plain job no fork at all, were its limit not raised by them."""
    scorer = path_scorer("plain")
    busy = f"import threading, sys; [threading.Thread(target=sys.stdin.read, daemon=True).start() " \
           f"for _ in range({2 * Limits().max_processes})]; print(flush=True); sys.stdin.read()"
    neighbour = subprocess.Popen([scorer.layers.python, "-I", "-c", busy], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, **as_uid(scorer.layers.uid))
    try:
        neighbour.stdout.readline()  # its threads run
        assert threads_of_uid(scorer.layers.uid) > Limits().max_processes
        with scorer:
            result = run_one(scorer, FORKS_FOUR, {"kind": "stdio", "inputs": [""], "outputs": ["forked"]})
        assert result.reward == 1.0, result.detail
    finally:
        neighbour.kill()
        neighbour.wait()

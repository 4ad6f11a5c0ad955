"""Hostile programs: each is contained, scores 0 and fails for the right reason."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from areal.rewards.sandbox.layers import SANDBOX_UID
from areal.rewards.sandbox.limits import Limits
from tests.rewards.conftest import (
    ProcessWatch,
    _nspids,
    host_pid_alive,
    job_pids,
    pids_with_marker,
    run_one,
    sandbox_pids,
    worker_pids,
)

MARKER = f"areal-hostile-{uuid.uuid4().hex[:12]}"
ONE_LINE = {"kind": "stdio", "inputs": ["\n"], "outputs": ["done"]}
CALL_ADD = {"kind": "call", "fn_name": "add", "inputs": [[3, 4]], "outputs": [7]}


@pytest.fixture(scope="module", autouse=True)
def nothing_left_behind():
    yield
    assert sandbox_pids() == set()
    assert pids_with_marker(MARKER) == set()
    places = [Path.cwd(), Path.home(), Path("/tmp"), Path("/work"), Path("/etc"), Path("/usr")]
    assert [p for place in places for p in place.glob(f"*{MARKER}*")] == []


def test_fork_bomb_is_capped_by_the_process_limit_and_times_out(solo):
    idle = sandbox_pids()  # the warm workers: bwrap, its init, the server, the next job's jail
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    with ProcessWatch() as watch:
        result = run_one(solo, bomb, ONE_LINE)
    assert (result.reward, result.reason) == (0.0, "timeout")
    # the job's PID 1 (the harness) is among the idle ones; the next job's may start as this one ends
    assert 10 < watch.max_sandbox_procs - len(idle) <= Limits().max_processes + 1
    assert job_pids() == set()


def test_memory_bomb_hits_the_address_space_limit(sandbox):
    bomb = "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))\n"
    result = run_one(sandbox, bomb, ONE_LINE)
    assert (result.reward, result.reason) == (0.0, "memory")


@pytest.mark.parametrize("program", ["while True:\n    pass\n", "import threading\nthreading.Event().wait()\n"])
def test_a_program_that_never_ends_is_stopped_at_the_wall_clock(sandbox, program):
    start = time.monotonic()
    result = run_one(sandbox, program, ONE_LINE)
    assert (result.reward, result.reason) == (0.0, "timeout")
    assert time.monotonic() - start < 5.0


def test_a_setsid_grandchild_dies_with_the_sandbox(sandbox):
    # the seccomp filter refuses setsid; without it, setsid succeeds: either way the grandchild must die
    program = (
        "import os, signal, sys\n"
        "if os.fork() == 0:\n"
        "    try:\n"
        "        os.setsid()\n"
        "    except PermissionError:\n"
        "        pass\n"
        f"    os.execv(sys.executable, [sys.executable, '-c', 'import signal; signal.pause()', {MARKER!r}])\n"
        "signal.pause()\n"
    )
    with ProcessWatch(marker=MARKER) as watch:
        result = run_one(sandbox, program, ONE_LINE)
    assert (result.reward, result.reason) == (0.0, "timeout")
    assert watch.seen_marker, "the grandchild never started, so the test proves nothing"
    assert [pid for pid in watch.seen_marker if host_pid_alive(pid)] == []


def test_writes_outside_the_work_dir_never_reach_the_host(sandbox, tmp_path):
    targets = [tmp_path / MARKER, Path.cwd() / MARKER, Path.home() / MARKER, Path("/usr") / MARKER]
    program = (
        "wrote = 0\n"
        f"for path in {[str(t) for t in targets]!r}:\n"
        "    try:\n"
        "        open(path, 'w').write('escaped')\n"
        "        wrote += 1\n"
        "    except OSError:\n"
        "        pass\n"
        "print(wrote)\n"
    )
    result = run_one(sandbox, program, {"kind": "stdio", "inputs": [""], "outputs": [str(len(targets))]})
    assert (result.reward, result.reason) == (0.0, "wrong_answer")
    assert "got '0\\n'" in result.detail
    assert [t for t in targets if t.exists()] == []


def test_secrets_in_the_parent_environment_are_unreadable(sandbox, monkeypatch):
    secret = f"s3cret-{uuid.uuid4().hex}"
    monkeypatch.setenv("AREAL_TEST_SECRET", secret)
    program = (
        "import os, glob\n"
        "found = os.environ.get('AREAL_TEST_SECRET')\n"
        "for path in glob.glob('/proc/*/environ'):\n"
        "    try:\n"
        "        for item in open(path, 'rb').read().split(b'\\0'):\n"
        "            if item.startswith(b'AREAL_TEST_SECRET='):\n"
        "                found = item.split(b'=', 1)[1].decode()\n"
        "    except OSError:\n"
        "        pass\n"
        "print(found or 'not found')\n"
    )
    result = run_one(sandbox, program, {"kind": "stdio", "inputs": [""], "outputs": [secret]})
    assert (result.reward, result.reason) == (0.0, "wrong_answer")
    assert "got 'not found\\n'" in result.detail


def test_no_connection_reaches_a_listener_on_the_host(sandbox):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        program = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=0.5)\n"
            "    print('connected')\n"
            "except OSError as exc:\n"
            "    print(type(exc).__name__)\n"
        )
        result = run_one(sandbox, program, {"kind": "stdio", "inputs": [""], "outputs": ["connected"]})
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert (result.reward, result.reason) == (0.0, "wrong_answer")


def test_100_mb_of_output_is_cut_at_the_output_limit(sandbox):
    program = "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 2**20)\n"
    result = run_one(sandbox, program, ONE_LINE)
    assert (result.reward, result.reason) == (0.0, "output_limit")


def test_killing_its_runner_or_everything_it_sees_changes_nothing(solo):
    # the runner is PID 1 of the job's namespace: its own jobs cannot kill it, nor see the server
    before = worker_pids(solo)
    program = (
        "import os, signal\n"
        "os.kill(os.getppid(), signal.SIGKILL)\n"
        "try:\n"
        "    os.kill(-1, signal.SIGKILL)\n"
        "except ProcessLookupError:\n"
        "    pass\n"
        "print('ppid', os.getppid())\n"
    )
    tests = {"kind": "stdio", "inputs": ["", ""], "outputs": ["ppid 1", "ppid 1"]}
    assert run_one(solo, program, tests).reward == 1.0  # both tests ran: the runner survived
    assert worker_pids(solo) == before


@pytest.mark.parametrize(
    "program",
    ["import sys\nsys.exit(0)\ndef add(a, b):\n    return a + b\n", "import os\nos._exit(0)\n"],
)
def test_exiting_before_the_tests_run_is_not_a_pass(sandbox, program):
    result = run_one(sandbox, program, CALL_ADD)
    assert (result.reward, result.passed, result.reason) == (0.0, 0, "crash")


def test_patching_the_checker_print_and_json_is_not_a_pass(sandbox):
    program = (
        "import builtins, json, os, sys\n"
        "always = lambda *a, **k: True\n"
        "for module in list(sys.modules.values()):\n"
        "    for name in list(vars(module)):\n"
        "        if any(w in name.lower() for w in ('check', 'compare', 'classify', 'verdict', 'watch')):\n"
        "            try:\n"
        "                setattr(module, name, always)\n"
        "            except (AttributeError, TypeError):\n"
        "                pass\n"
        "builtins.print = always\n"
        "json.dumps = lambda *a, **k: 'true'\n"
        'forged = b\'{"i": 0, "status": "ok", "out": "7"}\\n\'\n'
        "for fd in range(64):\n"
        "    try:\n"
        "        os.write(fd, forged)\n"
        "    except OSError:\n"
        "        pass\n"
        "class Anything:\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "def add(a, b):\n"
        "    return Anything()\n"
    )
    result = run_one(sandbox, program, CALL_ADD)
    assert (result.reward, result.reason) == (0.0, "wrong_answer")


def test_a_hostile_program_does_not_spoil_its_neighbours_in_the_batch(sandbox):
    good = "def add(a, b):\n    return a + b\n"
    bad = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
    results = sandbox([good, bad, good], [CALL_ADD] * 3)
    assert [r.reward for r in results] == [1.0, 0.0, 1.0]
    assert os.getpid() not in sandbox_pids()


def test_the_leftover_check_counts_this_test_process_own_sandboxes_only():
    """Another run's sandbox on the same machine (issue #36): a process in a PID namespace below
    ours, as the sandbox uid, that this process did not start, must not count as ours."""
    if shutil.which("unshare") is None:
        pytest.skip("util-linux's unshare is not installed")
    as_sandbox = f", user={SANDBOX_UID}, group={SANDBOX_UID}, extra_groups=[]" if os.geteuid() == 0 else ""
    quiet = "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL"
    starter = ("import subprocess\n"
               "other = subprocess.Popen(['unshare', '--user', '--pid', '--fork', 'sleep', '60'], "
               f"start_new_session=True, {quiet}{as_sandbox})\n"
               "print(other.pid)\n")
    started = subprocess.run([sys.executable, "-c", starter], capture_output=True, text=True, timeout=30)
    if started.returncode != 0:
        pytest.skip(f"cannot start a stand-in for another run here: {started.stderr.strip()[-200:]}")
    leader = int(started.stdout)  # its starter has exited: it is no descendant of ours
    try:
        deadline = time.monotonic() + 10
        while not (others := Path(f"/proc/{leader}/task/{leader}/children").read_text().split()):
            assert time.monotonic() < deadline, "the stand-in never started its namespace"
            threading.Event().wait(0.01)
        (other,) = others
        # what the machine-wide check counted: the sandbox uid as root, a nested PID namespace otherwise
        status = Path(f"/proc/{other}/status").read_text()
        nested = len(_nspids(int(other)) or []) > len(_nspids(os.getpid()) or [])
        assert f"Uid:\t{SANDBOX_UID}\t" in status if os.geteuid() == 0 else nested
        assert int(other) not in sandbox_pids()
    finally:
        os.killpg(leader, signal.SIGKILL)

"""Local workers forked from a run's fork server: each is what a freshly started `python -m` process would be, its
exit status comes back, and it dies with its session, its server and the controller."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from areal.errors import RunError
from areal.runtime.controller.launchers import ForkServer
from tests import descriptors
from tests.runtime.kills import exits_within

PROBE = textwrap.dedent("""
    import gc, json, os, random, signal, subprocess, sys

    def main(argv):
        what, code = argv
        print(json.dumps({"argv": argv, "leads_session": os.getsid(0) == os.getpid(), "env": os.environ.get("PROBE"),
                          "draw": random.random(), "stdin": sys.stdin.read(),
                          "sigchld_default": signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL,
                          "cwd": os.getcwd(), "frozen": gc.get_freeze_count()}), flush=True)
        print("said on stderr", file=sys.stderr, flush=True)
        if what == "child":  # a worker that started a process of its own, like a sandbox
            child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
            print(json.dumps({"child": child.pid}), flush=True)
        if what in ("child", "wait"):
            signal.pause()
        return int(code)
""")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the tests that share it: each start pays the imports once."""
    fork_server = ForkServer()
    yield fork_server
    fork_server.close()


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def status_within(handle, timeout_s: float) -> int | None:
    if exits_within(handle.pid, timeout_s):
        for _ in range(100):  # the server reaps it and says so right after it exits
            if handle.poll() is not None:
                return handle.poll()
            handle.server.read_replies(0.1)
    return handle.poll()


@pytest.fixture(autouse=True)
def probe_here(tmp_path, monkeypatch):
    """The probe module in the directory the test asks from: a worker imports from its controller's directory, as
    `python -m` there would, not from wherever the server started."""
    (tmp_path / "probe_worker.py").write_text(PROBE)
    monkeypatch.chdir(tmp_path)


def test_each_forked_worker_is_a_new_process_with_its_log_environment_and_exit_status(server, tmp_path):
    env = {**os.environ, "PROBE": "given"}
    first = server.start("probe_worker", ("exit", "3"), tmp_path / "a.log", env)
    second = server.start("probe_worker", ("exit", "5"), tmp_path / "b.log", {**env, "PROBE": "other"})
    assert (status_within(first, 60), status_within(second, 60)) == (3, 5)
    a, b = lines(tmp_path / "a.log")[0], lines(tmp_path / "b.log")[0]
    assert (a["argv"], a["env"], b["env"]) == (["exit", "3"], "given", "other")
    assert a["leads_session"] and b["leads_session"] and a["sigchld_default"] and a["stdin"] == ""
    assert a["draw"] != b["draw"]  # seeded afresh, not the server's sequence twice
    assert a["cwd"] == str(tmp_path)
    assert a["frozen"] > 10_000  # the server's imports, frozen before the fork: no full collection scans them
    assert "said on stderr" in (tmp_path / "a.log").read_text()
    assert first.pid not in {os.getpid(), server.process.pid} and first.pid != second.pid


def test_kill_ends_the_workers_whole_session_and_reports_sigkill(server, tmp_path):
    handle = server.start("probe_worker", ("child", "0"), tmp_path / "w.log", dict(os.environ))
    for _ in range(600):
        if (tmp_path / "w.log").exists() and any("child" in line for line in lines(tmp_path / "w.log")):
            break
        server.read_replies(0.1)
    child = next(line["child"] for line in lines(tmp_path / "w.log") if "child" in line)
    assert handle.poll() is None
    handle.kill()
    assert handle.poll() == -signal.SIGKILL
    assert exits_within(child, 10.0)  # the worker's own child went down with it


def test_a_worker_dies_with_its_fork_server_and_the_server_with_the_controller(tmp_path):
    # a controller of its own, in a process this test can kill: it starts a server, forks a worker, says both pids
    controller = textwrap.dedent(f"""
        import json, os, sys
        from pathlib import Path
        from areal.runtime.controller.launchers import ForkServer
        server = ForkServer()
        worker = server.start("probe_worker", ("wait", "0"), Path({str(tmp_path)!r}) / "w.log", dict(os.environ))
        print(json.dumps({{"server": server.process.pid, "worker": worker.pid}}), flush=True)
        sys.stdin.read()
    """)
    process = subprocess.Popen([sys.executable, "-c", controller], cwd=tmp_path, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        pids = json.loads(process.stdout.readline())
        assert not exits_within(pids["worker"], 0.2)
        process.kill()
        assert exits_within(pids["server"], 30.0) and exits_within(pids["worker"], 30.0)
    finally:
        process.kill()
        process.wait(10)


def test_a_worker_whose_module_cannot_be_imported_exits_1_with_the_error_in_its_log(server, tmp_path):
    handle = server.start("no_such_worker_module", (), tmp_path / "w.log", dict(os.environ))
    assert status_within(handle, 60) == 1
    assert "No module named 'no_such_worker_module'" in (tmp_path / "w.log").read_text()
    assert server.alive()  # the server goes on forking


def test_a_fork_server_that_cannot_start_is_said_with_its_log(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", "/bin/false")  # exits at once, as a broken install would
    with pytest.raises(RunError, match=r"fork server that starts local workers exited with code 1 \(its output is"):
        ForkServer().start("probe_worker", (), tmp_path / "w.log", dict(os.environ))


def test_runs_in_one_process_share_its_fork_server_until_it_dies(tmp_path):
    from areal.runtime.controller.launchers import fork_server

    first = fork_server()
    assert fork_server() is first  # a second run pays no imports
    first.process.kill()
    first.process.wait(10)
    assert fork_server() is not first and fork_server().alive()  # a dead one is replaced, not reused


def test_a_process_forked_from_the_controller_starts_a_server_of_its_own(tmp_path):
    from areal.runtime.controller.launchers import fork_server

    parent = fork_server()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a controller forked from this one (multiprocessing's fork, a notebook's helper)
        os.close(read_end)
        try:
            mine = fork_server()
            os.write(write_end, json.dumps([mine is not parent, mine.alive()]).encode())
            mine.close()
        finally:
            os._exit(0)
    os.close(write_end)
    answer = json.loads(os.read(read_end, 100))
    os.close(read_end)
    os.waitpid(pid, 0)
    assert answer == [True, True]
    assert fork_server() is parent and parent.alive()  # the parent's own server is untouched


def test_a_server_whose_reply_pipe_is_past_descriptor_1023_reports_its_workers(tmp_path):
    with descriptors.low_descriptors_taken():
        fork_server = ForkServer()
        try:
            assert fork_server._replies > descriptors.SELECT_LIMIT
            handle = fork_server.start("probe_worker", ("exit", "4"), tmp_path / "w.log", dict(os.environ))
            assert status_within(handle, 60) == 4
        finally:
            fork_server.close()

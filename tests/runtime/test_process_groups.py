"""What a worker starts dies with it: when the worker is killed and replaced, and when the whole run is killed.

The advantage node of fake_rl.py (FAKE_TOOLS=1) starts a long-lived tool process per group and logs
"worker_pid tool_pid". Only those logged pids are looked at, and any still alive at the end are killed by pid.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from areal.cli.run import build_controller
from tests.spawned import end_session, wait_gone

RECIPE = Path(__file__).with_name("fake_rl.py")
DEADLINE_S = 20.0


def _tools(run: Path) -> dict[int, list[int]]:
    """worker pid -> the tool pids it started."""
    started: dict[int, list[int]] = {}
    path = run / "tools.txt"
    for line in path.read_text().splitlines() if path.exists() else []:
        if len(line.split()) == 2:
            worker, tool = map(int, line.split())
            started.setdefault(worker, []).append(tool)
    return started


def _alive(pid: int) -> bool:
    """Running, not a zombie nobody reaped yet (an orphan's reaper may be slow or absent in a container)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _survivors(pids: list[int]) -> list[int]:
    """The pids still alive after they have had DEADLINE_S to die."""
    return wait_gone(pids, DEADLINE_S)


def _kill_all(pids: list[int]) -> None:
    """Kill the tools still running; a pid that died already may have been reused, so its command line is read."""
    for pid in pids:
        with contextlib.suppress(OSError):
            if _alive(pid) and Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x00600\x00":
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow  # the guard the kill -9 test checks takes them too; this checks the controller's own kill
def test_a_killed_workers_tools_die_before_its_replacement_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_ADVANTAGE_POOL", "1")
    monkeypatch.setenv("FAKE_TOOLS", "1")
    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    run = tmp_path / "run"
    seen: dict[str, list[int]] = {}

    def on_event(controller) -> None:
        worker = controller.workers["advantage[0]"]
        if "victim" not in seen and len(_tools(run).get(worker.process.pid, [])) >= 2:
            seen["victim"] = [worker.process.pid]
            os.kill(worker.process.pid, signal.SIGKILL)
        elif "victim" in seen and "left" not in seen and worker.process.pid != seen["victim"][0] and worker.ready:
            seen["left"] = _survivors(_tools(run)[seen["victim"][0]])  # while the run goes on

    controller = build_controller(recipe, ["steps=4"], run, on_event=on_event)
    try:
        assert controller.run().version == 4
        assert seen.get("left") == [], f"tools of the killed worker outlived it: {seen}"
    finally:
        _kill_all([p for pids in _tools(run).values() for p in pids])


def test_kill_9_of_the_controller_takes_every_workers_tools_down(tmp_path):
    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    run = tmp_path / "run"
    env = {**os.environ, "FAKE_ADVANTAGE_POOL": "1", "FAKE_TOOLS": "1"}
    argv = [sys.executable, "-m", "areal.cli", "run", str(recipe), "--run-dir", str(run), "-q",
            "--set", "steps=1000"]
    log = tmp_path / "run.log"
    proc = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    try:
        deadline = time.monotonic() + 120
        while sum(map(len, _tools(run).values())) < 3 and proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.2)
        assert proc.poll() is None, f"the run ended before it was killed:\n{log.read_text()[-3000:]}"
        os.kill(proc.pid, signal.SIGKILL)  # the controller alone: its workers die with it, and must take their tools
        proc.wait(timeout=30)
        tools = [p for pids in _tools(run).values() for p in pids]
        assert tools and _survivors(tools) == []
    finally:
        _kill_all([p for pids in _tools(run).values() for p in pids])
        end_session(proc)

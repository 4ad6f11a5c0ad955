"""`areal run`'s exit status as a shell or a scheduler sees it: 0, 1 for a failed run, 2 for a user error,
128 + the signal's number for a run a signal ended (130 for Ctrl-C)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spawned import end_session

RECIPE = Path(__file__).parent / "runtime" / "fake_rl.py"


def start(tmp_path: Path, *overrides: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    argv = [sys.executable, "-m", "areal.cli", "run", str(recipe), "--run-dir", str(tmp_path / "run"), "-q"]
    for override in overrides:
        argv += ["--set", override]
    return subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_a_failed_run_exits_1_with_the_node_named(tmp_path):
    proc = start(tmp_path, "steps=4", "faults.policy=fail-fast", env={"FAKE_RAISE_ON_GROUP": "2"})
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 1, err[-2000:]
    assert "run failed" in err and "node 'advantage' (custom) raised ValueError: bad group 2" in err


def test_a_finished_run_exits_0(tmp_path):
    proc = start(tmp_path, "steps=2")
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-2000:]


def _wait_for(path: Path, text: str, proc: subprocess.Popen[str], timeout_s: float = 180) -> None:
    """Until `path` holds `text` (checked every 0.2 s while the run lives)."""
    for _ in range(int(timeout_s / 0.2)):
        if path.exists() and text in path.read_text():
            return
        try:
            proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            continue
        break
    raise AssertionError(f"{path} never said {text!r}:\n{proc.communicate()[1][-2000:]}")


def _stopped(tmp_path: Path, first: signal.Signals, *later: signal.Signals) -> tuple[int, str]:
    """An endless run whose trainer is held inside its second update (so stopping waits for it) gets `first`,
    then, once the controller said it is stopping, `later`; then the trainer is let go. (exit status, stderr)"""
    proc = start(tmp_path, "steps=100000", env={"FAKE_HOLD_AT": "1"})
    run = tmp_path / "run"
    try:
        _wait_for(run / "metrics.jsonl", '"kind": "step"', proc)
        while not (run / "held").exists() and proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.2)
        os.kill(proc.pid, first)  # the controller alone, as a terminal's Ctrl-C or hang-up reaches the foreground
        # the stop is decided while the trainer is held: released before, it could publish version 2 and start 3
        # first, and the exit checkpoint would be another version's (CI once lost that race)
        _wait_for(run / "logs" / "controller.log", "stopping the run", proc)
        for sig in later:
            os.kill(proc.pid, sig)
        (run / "release").touch()
        _, err = proc.communicate(timeout=120)
    finally:
        (run / "release").touch()
        end_session(proc)
    return proc.returncode, err


def test_ctrl_c_stops_the_run_with_130_and_keeps_a_checkpoint_whatever_comes_while_it_stops(tmp_path):
    """A scheduler or an impatient user signals again while the run stops: the first signal decides, and the
    checkpoint and the cleanup are not cut short."""
    code, err = _stopped(tmp_path, signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
    assert code == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    run = tmp_path / "run"
    assert (run / "checkpoints" / "step-000002" / "controller.json").exists()  # the held update's version
    assert list((run / "sockets").iterdir()) == []  # no socket file left


@pytest.mark.parametrize("first", [signal.SIGHUP, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)],
                         ids=["hang-up", "sigterm"])
def test_a_closed_terminal_or_a_scheduler_ends_a_run_like_ctrl_c_with_its_own_status(tmp_path, first):
    code, err = _stopped(tmp_path, first)
    assert code == 128 + first, err[-2000:]
    assert f"stopped by {first.name}" in err and "Traceback" not in err
    run = tmp_path / "run"
    assert (run / "checkpoints" / "step-000002" / "controller.json").exists()
    assert list((run / "sockets").iterdir()) == []

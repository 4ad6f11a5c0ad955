"""`areal run`'s exit status as a shell or a scheduler sees it: 0, 1 for a failed run, 2 for a user error, 130."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

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
    assert "run failed" in err and "node 'advantage' raised ValueError: bad group 2" in err


def test_a_finished_run_exits_0(tmp_path):
    proc = start(tmp_path, "steps=2")
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-2000:]


def test_ctrl_c_stops_the_run_with_130_and_keeps_a_checkpoint(tmp_path):
    proc = start(tmp_path, "steps=100000", env={"FAKE_STEP_WORK": "40"})
    metrics = tmp_path / "run" / "metrics.jsonl"
    try:
        for _ in range(900):  # up to 180 s: until the first step is trained
            if metrics.exists() and '"kind": "step"' in metrics.read_text():
                break
            try:
                proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
            break
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        os.kill(proc.pid, signal.SIGINT)  # the controller alone, as a terminal's Ctrl-C reaches the foreground
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err
    assert list((tmp_path / "run" / "checkpoints").glob("step-*/controller.json"))

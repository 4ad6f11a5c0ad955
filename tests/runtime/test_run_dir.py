"""A run directory belongs to one run: a second run on it while it is used fails at once naming the holder,
and a fresh run on a directory a run was started in is refused (only --resume continues it)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from areal.cli.run import build_controller
from areal.errors import ConfigError, RunError
from areal.runtime.storage.rundir import claim_run_dir

RECIPE = Path(__file__).with_name("fake_rl.py")


def test_a_locked_run_directory_is_refused_naming_the_holder_and_free_once_released(tmp_path):
    first = claim_run_dir(tmp_path / "run", resuming=False)
    with pytest.raises(RunError, match=rf"run directory .*run is in use by another run \(pid {os.getpid()}, "):
        claim_run_dir(tmp_path / "run", resuming=False)
    first.release()
    claim_run_dir(tmp_path / "run", resuming=False).release()


def test_a_fresh_run_in_a_directory_a_run_was_started_in_is_refused_but_resume_takes_it(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text("{}")  # what a started run leaves
    with pytest.raises(ConfigError, match=rf"run directory {run} holds a run already .*continue it with "
                                          rf"`areal run --resume {run}`"):
        claim_run_dir(run, resuming=False)
    claim_run_dir(run, resuming=True).release()
    with pytest.raises(ConfigError, match="holds a run already"):
        build_controller(RECIPE, ["steps=2"], run)  # what `areal run --run-dir` calls


def test_a_second_run_on_a_directory_in_use_fails_at_once_and_the_first_goes_on(tmp_path):
    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "areal.cli", "run", str(recipe), "--run-dir", str(run), "-q"]
    first = subprocess.Popen([*argv, "--set", "steps=100000"], env={**os.environ, "FAKE_HOLD_AT": "1"},
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        while not (run / "held").exists() and first.poll() is None:  # its trainer holds inside an update
            with contextlib.suppress(subprocess.TimeoutExpired):
                first.wait(timeout=0.2)
        assert first.poll() is None, first.communicate()[1][-2000:]
        sockets = sorted((run / "sockets").iterdir())
        second = subprocess.run([*argv, "--set", "steps=2"], capture_output=True, text=True, timeout=60)
        assert second.returncode == 2, second.stderr[-2000:]
        assert f"is in use by another run (pid {first.pid}" in second.stderr
        assert sorted((run / "sockets").iterdir()) == sockets and first.poll() is None  # the first run untouched
        first.send_signal(signal.SIGTERM)
        (run / "release").touch()
        assert first.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        (run / "release").touch()
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()

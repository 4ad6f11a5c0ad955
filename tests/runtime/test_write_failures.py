"""A write the controller makes that fails (a full disk, simulated by the failing call) ends the run with a run
error naming the file and the way on, never a traceback; the checkpoint it was sealing is not torn, and the run
resumes once there is room."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from areal.cli.run import build_controller, run_recipe
from areal.errors import RunError
from areal.runtime.storage import checkpoint

RECIPE = Path(__file__).with_name("fake_rl.py")
NO_SPACE = os.strerror(errno.ENOSPC)


def _recipe(tmp_path: Path) -> Path:
    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    return recipe


def _disk_full(src: str, dst: str, **_: object) -> None:
    raise OSError(errno.ENOSPC, NO_SPACE, str(dst))


# checkpoint.py's own view of shutil, with the copy of the policy into a checkpoint failing (nothing else is touched)
FULL_DISK_SHUTIL = SimpleNamespace(copyfile=_disk_full, rmtree=shutil.rmtree)


def _fails_naming_the_policy_file(recipe: Path, run: Path, capsys, overrides: list[str]) -> None:
    assert run_recipe(recipe, overrides=overrides, run_dir=run, live=False) == 1
    said = " ".join(capsys.readouterr().err.split())  # the console wraps long lines
    assert f"run failed: cannot write {run.resolve()}/checkpoints/.step-000002." in said
    assert (f"policy-actor.safetensors: {NO_SPACE}; free space (or restore write access to {run.resolve()}), "
            f"then continue with `areal run --resume {run.resolve()}`") in said
    assert "Traceback" not in said
    assert not list((run / "checkpoints").glob("step-*"))  # nothing torn: the staging folder is all there is


def test_an_exit_checkpoint_that_cannot_be_written_fails_the_run_naming_the_file(tmp_path, monkeypatch, capsys):
    recipe = _recipe(tmp_path)
    monkeypatch.setattr(checkpoint, "shutil", FULL_DISK_SHUTIL)  # the controller copies the policy into it
    _fails_naming_the_policy_file(recipe, tmp_path / "run", capsys, ["steps=2"])


@pytest.mark.slow
def test_an_interval_checkpoint_that_cannot_be_written_fails_the_run_and_resume_goes_on(tmp_path, monkeypatch,
                                                                                       capsys):
    recipe, run = _recipe(tmp_path), tmp_path / "run"
    monkeypatch.setattr(checkpoint, "shutil", FULL_DISK_SHUTIL)
    _fails_naming_the_policy_file(recipe, run, capsys, ["steps=4", "checkpoint.interval_steps=2"])
    monkeypatch.undo()  # room again
    assert run_recipe(recipe, overrides=["steps=4"], resume=run, live=False) == 0
    trained = [s for line in (run / "trained.jsonl").read_text().splitlines() for s in json.loads(line)["sample_ids"]]
    assert sorted(set(trained)) == list(range(4 * 2 * 3))


class FullDisk:
    """A metrics file on a full disk: every write fails as the kernel's would (no file name in the error)."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, NO_SPACE)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_metrics_line_that_cannot_be_written_fails_the_run_naming_the_file(tmp_path):
    run = tmp_path / "run"
    controller = build_controller(_recipe(tmp_path), ["steps=3"], run)
    controller.metrics._file = FullDisk()
    with pytest.raises(RunError, match=rf"cannot write {run.resolve()}/metrics.jsonl: {NO_SPACE}; .*then continue "
                                       rf"with `areal run --resume {run.resolve()}`"):
        controller.run()
    assert all(w.process.poll() is not None for w in controller.workers.values())
    assert list((run / "sockets").iterdir()) == []  # no socket file left


# the trainer's own part of the exit checkpoint (its optimizer state) meets a full disk, in the trainer's process
TRAINER_DISK_FULL = """

def _no_space(self, folder):
    if "step-000003" in folder:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), folder + "/optimizer.pt")


FakeTrainer.factory.save_checkpoint = _no_space
"""


def test_an_exit_checkpoint_the_trainer_cannot_write_fails_the_run_and_says_what_is_kept(tmp_path, capsys):
    recipe, run = tmp_path / "fake_rl.py", tmp_path / "run"
    recipe.write_text("import errno\n" + RECIPE.read_text() + TRAINER_DISK_FULL)
    assert run_recipe(recipe, overrides=["steps=3", "checkpoint.interval_steps=2"], run_dir=run, live=False) == 1
    said = " ".join(capsys.readouterr().err.split())
    assert re.search(r"run failed: the exit checkpoint at version 3 was not written \(actor\[0\]: \S*fake_rl\.py:\d+: "
                     rf"node 'actor' \(ppo-update\) raised OSError: \[Errno {errno.ENOSPC}\] {NO_SPACE}: "
                     rf"'{re.escape(str(run.resolve()))}/checkpoints/\.step-000003\.", said)
    assert (f"the newest checkpoint is step-000002, which `areal run --resume {run.resolve()}` continues from once "
            f"the cause is mended; version 3's policy weights are in {run.resolve()}/weights/actor/v000003.safetensors"
            ) in said
    assert "Traceback" not in said
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000002"]  # the staged part is gone

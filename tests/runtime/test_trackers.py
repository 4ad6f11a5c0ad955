"""Experiment trackers (records.trackers): each step's and held-out round's numbers reach them at its version, a
tracker that fails is dropped without losing a line of metrics.jsonl, a missing package is refused before the run,
TensorBoard drops what a resume rolled back, and a W&B run is one per areal run, continued on resume."""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import struct
from pathlib import Path

import pytest

from areal.cli.run import build_controller, run_recipe
from areal.config import RunConfig
from areal.errors import ConfigError
from areal.runtime.records.metrics import MetricsWriter, read_metrics
from areal.runtime.records.trackers import TensorBoardTracker, open_trackers

RECIPE = Path(__file__).with_name("fake_rl.py")
STEP = {"kind": "step", "version": 3, "reward_mean": 0.5, "tokens": 40, "cut": False, "policy": "strict"}


class Recording:
    where = "a list"

    def __init__(self, fails: bool = False) -> None:
        self.logged: list[tuple[str, int, dict[str, float]]] = []
        self.fails, self.closed = fails, False

    def log(self, kind: str, version: int, values: dict[str, float]) -> None:
        if self.fails:
            raise ConnectionError("the tracker's server is gone")
        self.logged.append((kind, version, values))

    def close(self, failed: bool) -> None:
        self.closed = "failed" if failed else "ended"


def test_step_and_eval_numbers_reach_each_tracker_at_their_version_and_a_failing_one_is_dropped(tmp_path, caplog):
    kept, failing = Recording(), Recording(fails=True)
    writer = MetricsWriter(tmp_path / "metrics.jsonl", trackers=[failing, kept])
    with caplog.at_level(logging.WARNING, logger="areal.controller"):
        writer.write(STEP)
        writer.write({"kind": "failed", "version": 3, "sample_id": 7, "reason": "crash"})
        writer.write({"kind": "eval", "version": 4, "pass@1": 0.25, "tasks": 8})
    writer.close(failed=True)
    # numbers only (a bool or a word is no scalar), the version as the axis, a failed sample's line is no curve
    assert kept.logged == [("step", 3, {"reward_mean": 0.5, "tokens": 40.0}), ("eval", 4, {"pass@1": 0.25, "tasks": 8})]
    assert writer.trackers == [kept] and kept.closed == "failed"
    assert "tracker Recording failed (ConnectionError: the tracker's server is gone)" in caplog.text
    assert [r["kind"] for r in read_metrics(tmp_path / "metrics.jsonl")] == ["step", "failed", "eval"]  # nothing lost


@pytest.mark.parametrize(("typed", "names"), [("wandb", ["wandb"]), ("tensorboard,wandb", ["tensorboard", "wandb"]),
                                              ("[tensorboard, wandb]", ["tensorboard", "wandb"]), ([], [])])
def test_trackers_are_named_as_typed_on_the_command_line(typed, names):
    assert RunConfig(records={"trackers": typed}).records.trackers == names


def test_an_unknown_tracker_or_one_whose_package_is_missing_is_refused_before_the_run_directory_exists(
        tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"records.trackers.0: .*'tensorboard' or 'wandb'"):
        build_controller(RECIPE, ["records.trackers=mlflow"], tmp_path / "run")
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else found(name, *a))
    with pytest.raises(ConfigError) as info:
        build_controller(RECIPE, ["records.trackers=wandb"], tmp_path / "run")
    assert str(info.value) == ("records.trackers: wandb needs the 'wandb' package "
                               "(pip install -c constraints.txt -e '.[track]')")
    assert not (tmp_path / "run").exists()


def wandb_records(run_dir: Path) -> list[dict]:
    """What each offline W&B run under `run_dir` holds: its run record and its history rows, in order. The file is
    a LevelDB-style log (a 7-byte header, then 32 KiB blocks of checksum, length, kind and payload) of protobuf
    records; W&B's own reader is in its Go core."""
    from wandb.proto import wandb_internal_pb2

    out = []
    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        data, pos, pending = path.read_bytes(), 7, b""
        while pos + 7 <= len(data):
            if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
                pos += 32768 - pos % 32768
                continue
            _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            pending, pos = pending + data[pos + 7:pos + 7 + length], pos + 7 + length
            if kind in (1, 4):  # a whole record, or a split one's last piece
                record = wandb_internal_pb2.Record()
                record.ParseFromString(pending)
                pending = b""
                if record.WhichOneof("record_type") == "run":
                    config = {u.key: json.loads(u.value_json) for u in record.run.config.update}
                    out.append({"run": record.run.run_id, "name": record.run.display_name,
                                "project": record.run.project, "config": config})
                elif record.WhichOneof("record_type") == "exit":
                    out.append({"exit_code": record.exit.exit_code})
                elif record.WhichOneof("record_type") == "history":
                    out.append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                for i in record.history.item})
    return out


@pytest.mark.track
def test_a_run_and_its_resume_mirror_metrics_jsonl_into_tensorboard_and_one_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the 'track' extra")
    import psutil  # wandb's own dependency
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_MODE", "offline")
    recipe, run = tmp_path / "fake_rl.py", tmp_path / "run"
    shutil.copy(RECIPE, recipe)
    trackers = ["records.trackers=tensorboard,wandb", "records.wandb_project=mirror"]
    assert run_recipe(recipe, overrides=["steps=3", *trackers], run_dir=run, live=False) == 0
    assert run_recipe(recipe, overrides=["steps=5"], resume=run, live=False) == 0
    steps = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "step"]
    assert [r["version"] for r in steps] == [1, 2, 3, 4, 5]
    assert not [p for p in psutil.Process().children(recursive=True) if p.name() == "wandb-core"]  # W&B's service

    board = EventAccumulator(str(run / "tensorboard"))
    board.Reload()
    points = board.Scalars("step/reward_mean")
    assert [e.step for e in points] == [r["version"] for r in steps]
    assert [e.value for e in points] == pytest.approx([r["reward_mean"] for r in steps])  # float32 there

    records = wandb_records(run)
    runs = [r for r in records if "run" in r]
    assert len(runs) == 2 and {r["run"] for r in runs} == {(run / "wandb-id").read_text().strip()}  # one W&B run
    assert {(r["name"], r["project"]) for r in runs} == {("run", "mirror")}
    assert runs[0]["config"]["steps"] == 3 and runs[1]["config"]["steps"] == 5
    assert [r["exit_code"] for r in records if "exit_code" in r] == [0, 0]
    rows = [r for r in records if "step/reward_mean" in r]
    assert [(r["version"], r["step/reward_mean"]) for r in rows] == [(r["version"], r["reward_mean"]) for r in steps]


@pytest.mark.track
def test_tensorboard_drops_what_a_resume_rolled_back(tmp_path):
    pytest.importorskip("tensorboard", reason="the 'track' extra")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first = MetricsWriter(tmp_path / "metrics.jsonl", trackers=[TensorBoardTracker(tmp_path / "tb", None)])
    for version in (1, 2, 3, 4):  # the checkpoint was at 2; 3 and 4 are lost with the crash
        first.write({"kind": "step", "version": version, "reward_mean": version / 10})
    first.close()
    again = MetricsWriter(tmp_path / "metrics.jsonl", keep_lines=2, trackers=[TensorBoardTracker(tmp_path / "tb", 2)])
    for version in (3, 4):
        again.write({"kind": "step", "version": version, "reward_mean": version})
    again.close()
    board = EventAccumulator(str(tmp_path / "tb"))
    board.Reload()
    points = board.Scalars("step/reward_mean")
    assert [e.step for e in points] == [1, 2, 3, 4]
    assert [e.value for e in points] == pytest.approx([0.1, 0.2, 3.0, 4.0])


@pytest.mark.track
def test_a_wandb_run_that_cannot_start_refuses_the_run_in_wandbs_words_with_the_ways_out(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="the 'track' extra")

    def no_key(**settings):
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setattr(wandb, "init", no_key)
    with pytest.raises(ConfigError) as info:
        open_trackers(RunConfig(records={"trackers": "wandb"}), tmp_path, None)
    assert str(info.value) == ("records.trackers=wandb: W&B did not start the run's W&B run (UsageError: No API key "
                               "configured. Use `wandb login` to log in.); log in (wandb login, or WANDB_API_KEY), or "
                               "set WANDB_MODE=offline to keep it under the run directory for wandb sync")


@pytest.mark.track
def test_a_run_that_fails_shows_as_failed_in_wandb(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the 'track' extra")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("FAKE_SETUP_ERROR", "no tools here")
    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    assert run_recipe(recipe, overrides=["steps=3", "records.trackers=wandb"], run_dir=tmp_path / "run",
                      live=False) == 1
    assert [r["exit_code"] for r in wandb_records(tmp_path / "run") if "exit_code" in r] == [1]


@pytest.mark.track
@pytest.mark.parametrize(("setting", "env", "project"), [(None, None, "areal"), (None, "sweep", "sweep"),
                                                         ("mine", "sweep", "mine")])
def test_the_wandb_project_is_the_runs_setting_else_wandbs_own_variable_else_areal(tmp_path, monkeypatch, setting,
                                                                                   env, project):
    pytest.importorskip("wandb", reason="the 'track' extra")
    monkeypatch.setenv("WANDB_MODE", "offline")
    if env is None:
        monkeypatch.delenv("WANDB_PROJECT", raising=False)
    else:
        monkeypatch.setenv("WANDB_PROJECT", env)
    [tracker] = open_trackers(RunConfig(records={"trackers": "wandb", "wandb_project": setting}), tmp_path, None)
    tracker.close(failed=False)
    assert [r["project"] for r in wandb_records(tmp_path) if "run" in r] == [project]

"""Fault injection: workers killed at random points; nothing lost, nothing trained twice."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest

from areal.cli.run import build_controller, run_recipe
from areal.errors import RunError
from tests.runtime.kills import KillOnce

RECIPE = Path(__file__).with_name("fake_rl.py")
B, G, STEPS = 2, 3, 10


def _controller(tmp_path: Path, *overrides: str, kill: str | None = None, at_version: int = 0):
    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    killer = KillOnce(kill, at_version) if kill else None
    controller = build_controller(recipe, [f"steps={STEPS}", f"batch_size={B}", f"group_size={G}", *overrides],
                                  tmp_path / "run", on_event=killer or (lambda controller: None))
    return controller, killer.killed if killer else []


def _trained_ids(run: Path) -> list[int]:
    lines = (run / "trained.jsonl").read_text().splitlines()
    return [sid for line in lines for sid in json.loads(line)["sample_ids"]]


@pytest.mark.parametrize("victim,seed", [("rollout[0]", 1), ("advantage[0]", 2)])
def test_killed_worker_is_restarted_and_every_sample_is_trained_once(tmp_path, monkeypatch, victim, seed):
    monkeypatch.setenv("FAKE_ADVANTAGE_POOL", "1")
    monkeypatch.setenv("FAKE_STEP_WORK", "80")
    at = random.Random(seed).randrange(1, STEPS - 2)
    controller, killed = _controller(tmp_path, kill=victim, at_version=at)
    state = controller.run()
    assert killed, "the victim was never killed"
    assert state.version == STEPS
    ids = _trained_ids(Path(controller.plan.run_dir))
    assert sorted(ids) == list(range(STEPS * B * G))  # none lost, none twice
    summary = controller.accounting.summary()
    assert summary["started"] == summary["trained"] + summary["failed"] + summary["in_flight"]
    restarts = [json.loads(line) for line in (Path(controller.plan.run_dir) / "metrics.jsonl").read_text().splitlines()
                if '"restart"' in line]
    assert [r["worker"] for r in restarts] == [victim] and "exited with code -9" in restarts[0]["why"]


def test_killed_trainer_stops_the_run_and_resume_trains_each_acknowledged_sample_once(tmp_path):
    controller, killed = _controller(tmp_path, "checkpoint.interval_steps=2", kill="actor[0]", at_version=5)
    expected = r"(?s)worker actor\[0\] exited with code -9.*continue with `areal run --resume "
    with pytest.raises(RunError, match=expected):
        controller.run()
    run = Path(controller.plan.run_dir)
    before = [json.loads(line) for line in (run / "trained.jsonl").read_text().splitlines()]
    acknowledged = max(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("step-*")
                       if (p / "controller.json").exists())  # the checkpoint the resume starts from
    assert run_recipe(tmp_path / "fake_rl.py", resume=run, live=False) == 0
    records = [json.loads(line) for line in (run / "trained.jsonl").read_text().splitlines()]
    kept = [r for r in before if r["version"] < acknowledged] + records[len(before):]
    assert sorted(sid for r in kept for sid in r["sample_ids"]) == list(range(STEPS * B * G))


def _advantage_failure(tmp_path, monkeypatch, **env: str):
    """The error a run stops with when its `advantage` node fails as `env` tells it to, and the run's controller."""
    for name, value in {**env, "FAKE_ADVANTAGE_POOL": "1"}.items():
        monkeypatch.setenv(name, value)
    controller, _ = _controller(tmp_path)
    with pytest.raises(RunError) as raised:
        controller.run()
    return str(raised.value), controller


def _at_the_recipe_line(tmp_path) -> str:
    """How a node error begins: the recipe's file and the line that added the node."""
    line = next(i for i, text in enumerate(RECIPE.read_text().splitlines(), 1) if text.startswith("g.add(advantage"))
    return f"{tmp_path / 'fake_rl.py'}:{line}: node 'advantage' (custom) raised ValueError: "


def test_a_node_that_raises_stops_the_run_at_once_at_its_recipe_line_with_its_own_frames(tmp_path, monkeypatch):
    message, controller = _advantage_failure(tmp_path, monkeypatch, FAKE_RAISE_ON_GROUP="3")
    assert message.startswith(_at_the_recipe_line(tmp_path) + "bad group 3\n")
    # the node's own frame, its file and the line that raised; no frame of the runtime before it
    assert 'fake_rl.py", line' in message and 'raise ValueError(f"bad group {RAISE_ON_GROUP}")' in message
    assert "areal/runtime" not in message.split("\n  (worker")[0]
    restarts = [line for line in (Path(controller.plan.run_dir) / "metrics.jsonl").read_text().splitlines()
                if '"restart"' in line]
    assert restarts == []  # the same input would raise again: no restart, no re-issue
    for w in controller.workers.values():
        assert w.process.poll() is not None


def test_node_that_keeps_failing_stops_the_run_with_its_name(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_RAISE_ON_GROUP", "3")
    controller, _ = _controller(tmp_path, "faults.max_restarts=1", "faults.node_errors=restart")
    expected = r"(?s)keeps failing: 2 failures within 300 s.*node 'advantage' \(custom\) raised ValueError"
    with pytest.raises(RunError, match=expected):
        controller.run()
    for w in controller.workers.values():
        assert w.process.poll() is not None


def test_a_node_busy_longer_than_dead_after_s_is_not_declared_silent(tmp_path, monkeypatch):
    # each optimizer step computes for well over dead_after_s; the worker's pulse thread keeps it alive
    monkeypatch.setenv("FAKE_TRAIN_WORK_MS", "1500")
    controller, _ = _controller(tmp_path, "steps=2", "faults.heartbeat_s=0.1", "faults.dead_after_s=0.5",
                                "faults.policy=fail-fast")
    state = controller.run()
    assert state.version == 2
    run = Path(controller.plan.run_dir)
    assert '"restart"' not in (run / "metrics.jsonl").read_text()
    steps = [json.loads(line) for line in (run / "trained.jsonl").read_text().splitlines()]
    assert len(steps) == 2
    assert min(s["compute_s"] for s in steps) > 2 * 0.5  # each step was silent for over twice dead_after_s


def _freeze_rollout_at_version_2(tmp_path, before_freezing=lambda: None, settings: tuple[str, ...] = ()) -> list[dict]:
    """A run whose rollout[0] is stopped (SIGSTOP: alive to the OS, silent to the controller) once version 2 is
    out, checked to train every sample once; the restarts it recorded."""
    stopped: list[int] = []

    def freeze(controller) -> None:
        worker = controller.workers["rollout[0]"]
        if not stopped and controller.state.version >= 2 and worker.ready:
            before_freezing()
            os.kill(worker.process.pid, signal.SIGSTOP)
            stopped.append(worker.process.pid)

    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    controller = build_controller(recipe, [f"steps={STEPS}", f"batch_size={B}", f"group_size={G}",
                                           "faults.heartbeat_s=0.1", "faults.dead_after_s=1", *settings],
                                  tmp_path / "run", on_event=freeze)
    try:
        state = controller.run()
    finally:
        for pid in stopped:  # never leave a stopped process behind, whatever happened
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert stopped and state.version == STEPS
    run = Path(controller.plan.run_dir)
    assert sorted(_trained_ids(run)) == list(range(STEPS * B * G))
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"restart"' in line]


def test_a_frozen_worker_is_declared_silent_restarted_and_its_work_trained_once(tmp_path):
    restarts = _freeze_rollout_at_version_2(tmp_path)
    assert [r["worker"] for r in restarts] == ["rollout[0]"] and "silent" in restarts[0]["why"]


def test_a_replacement_that_never_gets_ready_is_replaced_again_and_the_run_trains_everything_once(tmp_path,
                                                                                                  monkeypatch):
    """The frozen worker's replacement hangs while setting up (its node's setup never returns): not ready, so never
    silent in the controller's eyes; past the ready deadline it is killed and started again."""
    hang = tmp_path / "hang-once"
    monkeypatch.setenv("FAKE_SETUP_HANG_ONCE", str(hang))
    restarts = _freeze_rollout_at_version_2(tmp_path, before_freezing=hang.touch,
                                            settings=("faults.ready_timeout_s=3",))
    assert [r["worker"] for r in restarts] == ["rollout[0]", "rollout[0]"]
    assert "silent" in restarts[0]["why"] and "was not ready" in restarts[1]["why"]
    assert not hang.exists()  # the replacement did reach the hanging setup


def test_a_node_that_fails_while_setting_up_stops_the_run_at_once_with_its_error(tmp_path, monkeypatch):
    message, controller = _advantage_failure(tmp_path, monkeypatch, FAKE_SETUP_ERROR="advantage tables missing")
    assert message.startswith(_at_the_recipe_line(tmp_path) + "advantage tables missing\n")
    assert ", in setup\n" in message and 'raise ValueError(os.environ["FAKE_SETUP_ERROR"])' in message  # its own frame
    assert "while setting up" in message
    assert "restart" not in (Path(controller.plan.run_dir) / "metrics.jsonl").read_text()  # no futile restarts


def test_a_filtering_worker_killed_while_the_trainer_is_busy_regenerates_nothing_queued_for_it(tmp_path, monkeypatch):
    """The trainer is held inside its update of version 2 while every admitted group waits in its queue; the
    reward-and-filter worker is killed and replaced. Nothing was lost, so nothing is generated again, and each
    group the filter dropped frees its slot once (re-filtered copies once freed a slot per report: the gate
    over-admitted and the trainer stopped the run with "staleness bound broken")."""
    for name, value in {"FAKE_ADVANTAGE_POOL": "1", "FAKE_FILTER": "1", "FAKE_HOLD_AT": "2"}.items():
        monkeypatch.setenv(name, value)
    run = tmp_path / "run"
    killed: list[int] = []
    quiet_since: list[float] = []
    cpu_at_kill: list[float] = []

    def on_event(controller) -> None:
        worker = controller.workers["advantage[0]"]
        if not killed and (run / "held").exists():
            # every admitted group has left the filter's worker, for two heartbeats: it holds nothing
            if worker.counts.get("batches") != controller.admission.gate.started:
                quiet_since.clear()
            elif not quiet_since:
                quiet_since.append(time.monotonic())
            elif time.monotonic() - quiet_since[0] > 2 * controller.config.faults.heartbeat_s:
                cpu_at_kill.append(worker.cpu_total)
                os.kill(worker.process.pid, signal.SIGKILL)
                killed.append(worker.process.pid)
        elif killed and worker.process.pid != killed[0] and worker.ready:
            (run / "release").touch()  # the replacement is up: the trainer may finish its update

    controller, _ = _controller(tmp_path, "staleness=2", "steps=6", "faults.heartbeat_s=0.2",
                                "faults.dead_after_s=5")
    controller.on_event = on_event
    try:
        state = controller.run()
    finally:
        (run / "release").touch()  # never leave the trainer waiting, whatever happened
    assert killed and state.version == 6
    replacement = controller.workers["advantage[0]"]  # keeps the CPU its killed predecessor had reported
    assert cpu_at_kill[0] > 0 and replacement.cpu_s_before >= cpu_at_kill[0] and replacement.cpu_s > 0
    summary = controller.accounting.summary()
    assert summary["reissued"] == 0 and summary["duplicates_dropped"] == 0  # the trainer's queue was kept
    filtered_groups = {sid // G for sid in controller.accounting.filtered}
    assert filtered_groups and all(g % 3 == 0 for g in filtered_groups)
    assert controller.admission.gate.freed == len(filtered_groups)  # one slot per group, not per report
    assert summary["started"] == summary["trained"] + summary["failed"] + summary["filtered"] + summary["in_flight"]
    trained = _trained_ids(run)
    assert len(trained) == len(set(trained)) and not {sid // G for sid in trained} & filtered_groups


def test_a_worker_that_never_gets_ready_stops_the_run_at_faults_ready_timeout_s(tmp_path, monkeypatch, caplog):
    hang = tmp_path / "hang-once"
    hang.touch()  # the first setup that finds it never returns
    monkeypatch.setenv("FAKE_SETUP_HANG_ONCE", str(hang))
    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    controller = build_controller(recipe, ["steps=2", "faults.ready_timeout_s=2"], tmp_path / "run")
    with pytest.raises(RunError, match=r"^workers not ready after 2 s \(faults.ready_timeout_s\): "):
        controller.run()
    assert not hang.exists() and all(w.process.poll() is not None for w in controller.workers.values())
    # killed at once: it reads no stop command, and the stop had waited its 60 s for it
    assert not [r for r in caplog.records if "did not stop within" in r.getMessage()]

"""The declared graph is what runs: explicit producers, branches joined by group, filters that refill,
and the invariants (exactly once, η, resume) across a killed worker in a branch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from areal.cli.run import build_controller, run_recipe
from tests.runtime.kills import KillOnce

RECIPE = Path(__file__).with_name("branched_rl.py")
B, G = 2, 3


def _controller(tmp_path: Path, *overrides: str, on_event=None):
    recipe = tmp_path / "branched_rl.py"
    shutil.copy(RECIPE, recipe)
    return build_controller(recipe, list(overrides), tmp_path / "run", on_event=on_event)


def _trained(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "trained.jsonl").read_text().splitlines()]


def _metrics(run: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def _judged_by_a(records: list[dict]) -> bool:
    """Every trained sample's advantage is judge_a's score of that very sample (its id + 0.25)."""
    return all(a == s + 0.25 for r in records for s, a in zip(r["sample_ids"], r["advantages"], strict=True))


def test_take_gets_the_named_producers_field_and_both_branches_are_joined_row_by_row(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_UNEVEN_WORK", "30")  # judge_b's two replicas hand groups to the join out of order
    controller = _controller(tmp_path, "steps=4", 'placement={"judge_b": 2}')
    plan = controller.plan
    assert {c.src for c in plan.inputs_of("combine")} == {"judge_a", "judge_b"}  # two pools, side by side
    assert plan.binding("combine") == {"score": "judge_a.score", "other": "judge_b.score"}
    state = controller.run()
    records = _trained(Path(plan.run_dir))
    assert state.version == 4
    assert _judged_by_a(records)  # judge_a's score, not judge_b's, and of the same sample
    steps = _metrics(Path(plan.run_dir), "step")
    expected = [sum(r["sample_ids"]) / len(r["sample_ids"]) + 0.5 for r in records]  # judge_b's, as the reward
    assert [s["reward_mean"] for s in steps] == pytest.approx(expected)
    ids = [s for r in records for s in r["sample_ids"]]
    assert sorted(ids) == list(range(4 * B * G))
    # the two replicas judged every trained group between them (how they were dealt depends on when each
    # connected: a replica that starts late under load may get none, so the join's order is not asserted)
    assert sum(controller.workers[f"judge_b[{r}]"].counts["batches"] for r in (0, 1)) >= 4 * B


def test_a_worker_runs_with_what_it_imported_and_built_frozen_out_of_the_garbage_collectors_scans(tmp_path):
    """A full collection in a worker would scan torch's and transformers' objects (~400k, 0.2 s each time): the
    fork server freezes its imports before forking, and the worker what its nodes' setup built."""
    controller = _controller(tmp_path, "steps=1")
    controller.run()
    at_setup, running = _trained(Path(controller.plan.run_dir))[0]["frozen"]
    assert at_setup > 10_000  # the imports, frozen in the fork server
    assert running > at_setup  # and the trainer's own setup (this node among it), frozen before the run


def test_a_filter_drops_whole_groups_the_source_refills_and_every_step_holds_b_groups(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_FILTER", "1")
    monkeypatch.setenv("FAKE_STEP_WORK", "20")  # a slow generator: η is what bounds the lag
    controller = _controller(tmp_path, "steps=5")
    state = controller.run()
    run = Path(controller.plan.run_dir)
    records = _trained(run)
    assert state.version == 5 and [r["version"] for r in records] == list(range(5))
    groups = [sorted({s // G for s in r["sample_ids"]}) for r in records]
    assert all(len(g) == B for g in groups)  # refilled: B groups a step, none of them a multiple of 3
    assert all(g % 3 for step in groups for g in step)
    trained = [g for step in groups for g in step]
    assert trained == sorted(trained) and trained == [g for g in range(trained[-1] + 1) if g % 3]  # oldest first
    lags = [r["version"] - v for r in records for v in r["min_versions"]]
    assert max(lags) <= 1  # η=1 holds though filtered groups freed their slots
    summary = controller.accounting.summary()
    assert summary["filtered"] >= len([g for g in range(trained[-1]) if g % 3 == 0]) * G
    assert summary["started"] == summary["trained"] + summary["failed"] + summary["filtered"] + summary["in_flight"]


def test_a_node_after_a_filter_that_drops_whole_groups_is_never_called_with_no_rows(tmp_path, monkeypatch):
    calls = tmp_path / "spread-calls.txt"
    monkeypatch.setenv("FAKE_FILTER", "1")
    monkeypatch.setenv("FAKE_SPREAD", str(calls))
    controller = _controller(tmp_path, "steps=3")
    state = controller.run()
    assert state.version == 3
    rows = [int(n) for n in calls.read_text().split()]
    assert rows and 0 not in rows  # groups dropped whole reached `spread` as empty batches, never as calls
    summary = controller.accounting.summary()
    assert summary["filtered"] > 0 and summary["failed"] == 0
    assert summary["started"] == summary["trained"] + summary["filtered"] + summary["in_flight"]


def test_a_worker_killed_in_one_branch_is_restarted_and_every_sample_trains_once(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_BRANCH_WORK", "20")
    kill_judge_b = KillOnce("judge_b[0]", at_version=2)
    killed = kill_judge_b.killed
    controller = _controller(tmp_path, "steps=6", on_event=kill_judge_b)
    state = controller.run()
    run = Path(controller.plan.run_dir)
    ids = [s for r in _trained(run) for s in r["sample_ids"]]
    assert killed and state.version == 6
    assert sorted(ids) == list(range(6 * B * G))  # none lost, none twice
    assert [r["worker"] for r in _metrics(run, "restart")] == ["judge_b[0]"]
    assert _judged_by_a(_trained(run))
    summary = controller.accounting.summary()
    assert summary["started"] == summary["trained"] + summary["failed"] + summary["filtered"] + summary["in_flight"]


def test_a_joining_pool_of_two_replicas_gets_every_group_from_both_branches_on_the_same_replica(tmp_path):
    controller = _controller(tmp_path, "steps=4", 'placement={"combine": 2}')
    assert {c.routing for c in controller.plan.inputs_of("combine")} == {"by_group"}
    state = controller.run()
    run = Path(controller.plan.run_dir)
    ids = [s for r in _trained(run) for s in r["sample_ids"]]
    assert state.version == 4 and sorted(ids) == list(range(4 * B * G))
    batches = [controller.workers[f"combine[{r}]"].counts["batches"] for r in (0, 1)]
    assert all(n > 0 for n in batches) and sum(batches) >= 4 * B  # both replicas joined groups


def test_a_branched_run_resumes_from_its_checkpoint_training_each_sample_once(tmp_path):
    recipe = tmp_path / "branched_rl.py"
    shutil.copy(RECIPE, recipe)
    run = tmp_path / "run"
    assert run_recipe(recipe, overrides=["steps=4", "checkpoint.interval_steps=2"], run_dir=run, live=False) == 0
    shutil.rmtree(run / "checkpoints" / "step-000004")  # as if killed after step 4, before its checkpoint
    before = _trained(run)
    assert run_recipe(recipe, overrides=["steps=6"], resume=run, live=False) == 0
    kept = [r for r in before if r["version"] < 2]
    after = _trained(run)[len(before):]
    assert [r["version"] for r in kept + after] == list(range(6))
    assert sorted(s for r in kept + after for s in r["sample_ids"]) == list(range(6 * B * G))



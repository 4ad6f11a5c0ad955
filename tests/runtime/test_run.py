"""Real runs of a small custom-node graph across processes (no model): delivery, staleness, failure."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from areal.cli.run import build_controller, run_recipe
from areal.errors import ConfigError, RunError
from tests.local_model import make_checkpoint

RECIPE = Path(__file__).with_name("fake_rl.py")
TINY_RL = Path(__file__).with_name("tiny_rl.py")


def _run(tmp_path: Path, *overrides: str):
    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    controller = build_controller(recipe, list(overrides), tmp_path / "run")
    return controller


def _trained(controller) -> list[dict]:
    path = Path(controller.plan.run_dir) / "trained.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _assert_no_process_left(controller) -> None:
    for w in controller.workers.values():
        assert w.process.poll() is not None, w.worker_id
        with pytest.raises(ProcessLookupError):
            os.kill(w.process.pid, 0)


def test_four_node_graph_trains_every_sample_exactly_once(tmp_path):
    controller = _run(tmp_path, "steps=5", "batch_size=2", "group_size=3")
    state = controller.run()
    records = _trained(controller)
    ids = [sid for r in records for sid in r["sample_ids"]]
    assert state.version == 5
    assert [r["version"] for r in records] == [0, 1, 2, 3, 4]
    assert sorted(ids) == list(range(5 * 2 * 3)) and len(ids) == len(set(ids))
    summary = controller.accounting.summary()
    assert summary["trained"] == 30 and summary["failed"] == 0
    assert summary["started"] == summary["trained"] + summary["in_flight"]
    _assert_no_process_left(controller)


@pytest.mark.parametrize("eta", [0, 1, 4])
def test_staleness_bound_holds_on_recorded_versions(tmp_path, monkeypatch, eta):
    monkeypatch.setenv("FAKE_STEP_WORK", "40")  # a slow generator and a fast trainer
    monkeypatch.setenv("FAKE_TOKENS", "6")
    controller = _run(tmp_path, f"staleness={eta}", "steps=8", "batch_size=2", "group_size=2")
    controller.run()
    lags = [r["version"] - v for r in _trained(controller) for v in r["min_versions"]]
    assert len(lags) == 8 * 2 * 2
    assert max(lags) <= eta
    if eta == 0:
        assert set(lags) == {0}  # synchronous: every token comes from the version being trained
    else:
        assert max(lags) >= 1  # the slack was used: generation ran ahead of training
    assert dict(controller.state.staleness) == {lag: lags.count(lag) for lag in set(lags)}


def test_sync_mode_is_eta_zero(tmp_path):
    controller = _run(tmp_path, "mode=sync", "staleness=4", "steps=3", "batch_size=2", "group_size=2")
    controller.run()
    assert {r["version"] - v for r in _trained(controller) for v in r["min_versions"]} == {0}


@pytest.mark.parametrize("lag", [1, 3])
def test_lagged_mode_samples_every_step_from_the_policy_exactly_eta_versions_old(tmp_path, lag):
    controller = _run(tmp_path, "mode=lagged", f"staleness={lag}", "steps=6", "batch_size=2", "group_size=2")
    controller.run()
    records = _trained(controller)
    assert [r["version"] for r in records] == list(range(6))
    for r in records:  # the first steps have no older policy than v0
        assert set(r["min_versions"]) == {max(0, r["version"] - lag)}, r
    lags = [r["version"] - v for r in records for v in r["min_versions"]]
    assert dict(controller.state.staleness) == {k: lags.count(k) for k in set(lags)}


def test_lagged_mode_scores_held_out_rounds_on_the_sampled_policy_and_the_last_on_the_trained_one(
        tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_HELDOUT", "2")
    controller = _run(tmp_path, "mode=lagged", "staleness=2", "steps=6", "eval.interval_steps=3",
                      "batch_size=2", "group_size=2")
    controller.run()
    # at the start (v0), after step 3 (generators hold v1), and after training (v6, sent for that round)
    assert [e["version"] for e in controller.state.evals] == [0, 1, 6]


def test_lagged_mode_refuses_to_resume(tmp_path):
    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    run = tmp_path / "run"
    assert run_recipe(recipe, overrides=["mode=lagged", "staleness=1", "steps=2"], run_dir=run, live=False) == 0
    with pytest.raises(ConfigError, match="mode=lagged: a run cannot resume"):
        run_recipe(recipe, overrides=["steps=4"], resume=run, live=False)


def test_node_that_raises_stops_a_fail_fast_run_naming_it_and_leaves_no_process(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_RAISE_ON_GROUP", "3")
    controller = _run(tmp_path, "steps=50", "batch_size=2", "group_size=2", "faults.policy=fail-fast")
    raised = r"fake_rl.py:\d+: node 'advantage' \(custom\) raised ValueError: bad group 3"
    with pytest.raises(RunError, match=raised) as caught:
        controller.run()
    _assert_no_process_left(controller)
    log = Path(str(caught.value).split("log: ")[1].split(")")[0])
    assert log.parent == Path(controller.plan.run_dir) / "logs" and "bad group 3" in log.read_text()


def test_a_generators_own_group_size_is_what_runs(tmp_path):
    # tiny_rl's config says group_size=3; its generate node says 2
    recipe = tmp_path / "tiny_rl.py"
    text = TINY_RL.read_text().replace('g.add(generate("rollout"))', 'g.add(generate("rollout", group_size=2))')
    recipe.write_text(text)
    model = make_checkpoint(tmp_path / "ckpt")
    controller = build_controller(recipe, [f"model={model}", "steps=2"], tmp_path / "run")
    controller.run()
    summary = controller.accounting.summary()
    assert (summary["started"], summary["trained"]) == (2 * 2 * 2, 2 * 2 * 2)  # steps x B x the generator's G
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [s["samples"] for s in steps if s["kind"] == "step"] == [4, 4]


@pytest.mark.parametrize(("solved", "pass_at_1"), [((), 0.0), (("eval.solved=advantage.passed",), 1.0),
                                                   (("eval.solved_at=0.5",), 1.0)])
def test_a_weighted_reward_reports_its_mean_and_pass_at_1_counts_what_eval_solved_says(tmp_path, monkeypatch,
                                                                                       solved, pass_at_1):
    """A reward of 0.7 for a passing sample: the reported reward is 0.7; pass@1 and the step's `solved` count a
    sample solved by the field and threshold eval.solved and eval.solved_at name (by default, reward >= 1)."""
    monkeypatch.setenv("FAKE_HELDOUT", "2")
    monkeypatch.setenv("FAKE_REWARD", "0.7")
    controller = _run(tmp_path, "steps=2", "eval.interval_steps=0", *solved)
    state = controller.run()
    assert [e["pass@1"] for e in state.evals] == [pass_at_1, pass_at_1]
    assert all(e["reward_mean"] == pytest.approx(0.7) for e in state.evals)
    steps = [json.loads(x) for x in (Path(controller.plan.run_dir) / "metrics.jsonl").read_text().splitlines()
             if '"kind": "step"' in x]
    assert [s["solved"] for s in steps] == [pass_at_1] * 2 and all(s["reward_mean"] == pytest.approx(0.7)
                                                                   for s in steps)


def test_eval_solved_must_name_a_nodes_output(tmp_path):
    with pytest.raises(ConfigError, match=r"eval\.solved='advantage\.nope': no node 'advantage' with an output"):
        _run(tmp_path, "eval.solved=advantage.nope")


def test_a_run_ended_by_max_minutes_trains_no_step_after_its_last_held_out_round_begins(tmp_path, monkeypatch):
    # η = 4: when the time is up, four more steps' groups are in flight; the trainers must not train them while
    # the last round samples, or it would read several policies under the one version it names
    monkeypatch.setenv("FAKE_HELDOUT", "6")
    monkeypatch.setenv("FAKE_TRAIN_WORK_MS", "20")
    controller = _run(tmp_path, "steps=100000", "max_minutes=0.04", "staleness=4", "eval.interval_steps=0")
    state = controller.run()
    lines = [json.loads(line) for line in (Path(controller.plan.run_dir) / "metrics.jsonl").read_text().splitlines()]
    steps, evals = [r for r in lines if r["kind"] == "step"], [r for r in lines if r["kind"] == "eval"]
    assert 0 < state.version < 100000 and [e["version"] for e in evals] == [0, state.version]
    assert steps[-1]["version"] == state.version and steps[-1]["wall_s"] <= evals[-1]["wall_s"]
    assert max(r["version"] for r in _trained(controller)) == state.version - 1  # trained at v, published v + 1

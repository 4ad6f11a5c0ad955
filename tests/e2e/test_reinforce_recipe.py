"""recipes/reinforce_rl.py, a trainer node written in the recipe (docs/trainer-nodes.md), runs as a user runs it,
is held to η like ppo_update, and learns on a fixed set of training tasks."""

from __future__ import annotations

import pytest

from areal.runtime.records.sample_records import read_samples
from tests.e2e.fixed_tasks import run_on_fixed_tasks

BATCH, GROUP = 4, 4


@pytest.mark.slow  # ~40 s: a whole run as a user starts it (test_own_trainer.py checks the same promises faster)
def test_the_reinforce_recipe_trains_every_step_and_records_each_samples_lag(tmp_path):
    lines = run_on_fixed_tasks(tmp_path, "reinforce_rl.py", BATCH, [
        "steps=3", f"batch_size={BATCH}", f"group_size={GROUP}", "eval.interval_steps=0", "eval.tasks=0",
        "checkpoint.interval_steps=0", "generation.max_new_tokens=24"])
    steps = [x for x in lines if x["kind"] == "step"]
    assert [s["version"] for s in steps] == [1, 2, 3] and all(s["grad_norm"] > 0 for s in steps)
    assert steps[-1]["trained"] == 3 * BATCH * GROUP
    trained = {sid: r for sid, r in read_samples(tmp_path / "run").items() if r.status == "trained"}
    assert len(trained) == 3 * BATCH * GROUP
    assert all(r.lag == r.step - 1 - min(r.versions) and r.lag <= 1 for r in trained.values())  # η = 1
    assert sum(int(lag) * n for s in steps for lag, n in s["staleness"].items()) == sum(
        r.lag for r in trained.values())


@pytest.mark.slow  # ~2 min on 2 cores
def test_reinforce_raises_the_reward_on_a_fixed_training_set(tmp_path):
    lines = run_on_fixed_tasks(tmp_path, "reinforce_rl.py", 8, [
        "seed=0", "steps=30", "batch_size=8", "group_size=8", "trainer.lr=1e-4", "trainer.warmup_steps=0",
        "eval.samples=16", "eval.interval_steps=30", "checkpoint.interval_steps=0"])
    evals = [x for x in lines if x["kind"] == "eval"]
    assert [e["version"] for e in evals] == [0, 30]
    assert evals[-1]["reward_mean"] >= evals[0]["reward_mean"] + 0.05, evals

"""recipes/actor_critic.py runs as declared: two trainers with their own versions and weights routes, the
critic's weights reaching only its values pool, both checkpointed and resumed without training a sample
twice."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from areal.cli.run import build_controller, run_recipe

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "actor_critic.py"
B, G = 2, 4
SMALL = [f"batch_size={B}", f"group_size={G}", "eval.tasks=0", "checkpoint.interval_steps=2",
         "generation.max_new_tokens=24", "nodes.critic.lr=3e-3", "nodes.critic.warmup_steps=0"]


def _steps(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "step"]


def test_two_models_train_each_on_its_own_route_and_resume_together(tmp_path):
    run = tmp_path / "run"
    plan = build_controller(RECIPE, ["steps=3", *SMALL], tmp_path / "plan-only").plan
    assert set(plan.weights_routes) == {("actor", "rollout"), ("critic", "values")}  # each model to its own
    # η=0: step 3's groups are admitted after the actor's version 2, long after the critic's version 1 (trained on
    # the same step-1 batch as the actor's 1); at η=2 all 3 steps' groups could be valued by the untrained critic
    assert run_recipe(RECIPE, overrides=["steps=3", *SMALL, "staleness=0"], run_dir=run, live=False) == 0
    first = _steps(run)
    records = [json.loads(line)["kind"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert "eval" not in records  # eval.tasks=0: no held-out round, not even at the start or the end
    # the critic starts with a zero head (every value exactly 0): values other than 0 come from trained weights
    assert any(s.get("value_mean", 0.0) != 0.0 for s in first)
    # the critic's numbers join the next step record of the actor after they arrive: some record carries them
    assert any({"critic_loss", "critic_explained_variance"} <= set(s) for s in first)
    # the run ends when the slower trainer reaches 3; the critic's last version may land after the actor's last
    # step record (two workers' sockets), so its weights, not that record, show it got there
    assert first[-1]["actor_version"] == 3 and (run / "weights" / "critic" / "v000003.safetensors").exists()
    parts = {p.name for p in (run / "checkpoints" / "step-000002").iterdir()}
    assert {"trainer-actor", "trainer-critic", "policy-actor.safetensors", "policy-critic.safetensors"} <= parts
    for later in (d for d in (run / "checkpoints").iterdir() if d.name != "step-000002"):
        shutil.rmtree(later)  # as if killed after step 3, before any checkpoint after step 2
    # η=0 after the resume: step 3's groups alone are scored before its record, all by the critic as resumed
    assert run_recipe(RECIPE, overrides=["steps=4", *SMALL, "staleness=0"], resume=run, live=False) == 0
    resumed = _steps(run)[len([s for s in first if s["version"] <= 2]):]
    assert [s["version"] for s in resumed] == [3, 4]
    assert resumed[0]["value_mean"] != 0.0  # the checkpoint's trained critic, not a fresh one (its values all 0)
    assert min(s["critic_version"] for s in resumed) >= 2  # the critic went on from its checkpointed version
    assert (run / "weights" / "critic" / "v000004.safetensors").exists()  # and trained all four of its own
    end = resumed[-1]
    assert end["trained"] == 4 * B * G and end["duplicates_dropped"] == 0
    assert end["started"] == end["trained"] + end["failed"] + end["filtered"] + end["in_flight"]

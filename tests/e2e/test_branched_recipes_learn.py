"""The branched recipes, run as a user runs them on a fixed training set: each learns, loses nothing and
keeps η; the KL recipe reports its KL, the dynamic-sampling one filters and refills, the code-repair
episodes learn with their feedback masked out of the loss."""

from __future__ import annotations

import pytest

from tests.e2e.fixed_tasks import run_on_fixed_tasks

STALENESS = 2
BATCH, GROUP, STEPS = 8, 8, 30
SETTINGS = ["seed=0", f"steps={STEPS}", f"batch_size={BATCH}", f"group_size={GROUP}", f"staleness={STALENESS}",
            "trainer.lr=1e-4", "trainer.warmup_steps=0", "eval.samples=16", f"eval.interval_steps={STEPS}",
            "checkpoint.interval_steps=0"]


def _check_learns_and_keeps_the_invariants(lines: list[dict]) -> dict:
    steps = [x for x in lines if x["kind"] == "step"]
    evals = [x for x in lines if x["kind"] == "eval"]
    assert [e["version"] for e in evals] == [0, STEPS]
    first, last = evals[0]["reward_mean"], evals[-1]["reward_mean"]
    assert last >= first + 0.05, f"reward on the training set went {first:.3f} -> {last:.3f}"
    assert [s["version"] for s in steps] == list(range(1, STEPS + 1))
    assert max(int(lag) for s in steps for lag in s["staleness"]) <= STALENESS
    end = steps[-1]
    assert end["started"] == end["trained"] + end["failed"] + end["filtered"] + end["in_flight"]
    assert end["duplicates_dropped"] == 0
    return end


@pytest.mark.slow  # ~3 min on 2 cores
def test_the_kl_recipe_learns_with_the_reference_branch_beside_the_reward_and_reports_kl(tmp_path):
    lines = run_on_fixed_tasks(tmp_path, "kl_rl.py", BATCH, SETTINGS)
    end = _check_learns_and_keeps_the_invariants(lines)
    assert end["trained"] == STEPS * BATCH * GROUP
    kls = [s["kl"] for s in lines if s["kind"] == "step"]
    assert all(k >= 0 for k in kls) and kls[0] < 1e-3  # k3 is never negative; it starts at the reference
    assert max(kls) > 10 * max(kls[0], 1e-6)  # and the policy moves away from it


@pytest.mark.slow  # ~3 min on 2 cores
def test_the_dynamic_sampling_recipe_filters_groups_refills_them_and_learns(tmp_path):
    lines = run_on_fixed_tasks(tmp_path, "dapo_rl.py", BATCH, SETTINGS)
    end = _check_learns_and_keeps_the_invariants(lines)
    assert end["filtered"] > 0 and end["filtered"] % GROUP == 0  # whole groups
    assert end["trained"] == STEPS * BATCH * GROUP  # every step still B groups, all informative


@pytest.mark.slow  # ~5 min on 2 cores
def test_the_actor_critic_recipe_learns_and_its_critic_fits_the_returns(tmp_path):
    # the recipe sets the critic's lr itself: each trainer's lr goes to its node
    settings = [s for s in SETTINGS if not s.startswith("trainer.lr=")]
    settings += ["nodes.actor.lr=1e-4", "nodes.critic.lr=1e-3"]
    lines = run_on_fixed_tasks(tmp_path, "actor_critic.py", BATCH, settings)
    end = _check_learns_and_keeps_the_invariants(lines)
    assert end["trained"] == STEPS * BATCH * GROUP
    critic = [s["critic_loss"] for s in lines if s["kind"] == "step" and "critic_loss" in s]
    assert sum(critic[-5:]) / 5 < 0.7 * sum(critic[:5]) / 5, f"critic loss {critic[:5]} -> {critic[-5:]}"


@pytest.mark.slow  # ~5 min on 2 cores
@pytest.mark.timeout(1500)
def test_the_multi_turn_code_repair_recipe_learns(tmp_path):
    # its reward is the hidden tests after up to 3 turns; the eval rounds score the same tasks the same way
    lines = run_on_fixed_tasks(tmp_path, "code_repair.py", BATCH, SETTINGS)
    end = _check_learns_and_keeps_the_invariants(lines)
    assert end["trained"] == STEPS * BATCH * GROUP and end["failed"] == 0  # no episode ran out of context or time

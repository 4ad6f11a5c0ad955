"""`areal run recipes/code_rl.py` on a fixed set of training tasks: the policy visibly learns.

The held-out file is the training file itself, so the eval rounds measure reward on the fixed
training set; version 0 is the warm-start policy. Seeded, so a rerun samples the same tokens.
"""

from __future__ import annotations

import pytest

from tests.e2e.fixed_tasks import run_on_fixed_tasks

STALENESS = 2
BATCH, GROUP, STEPS = 8, 8, 40


@pytest.mark.slow  # ~2 min on 2 cores
def test_reward_on_a_fixed_training_set_rises_within_the_staleness_bound_and_nothing_is_lost(tmp_path):
    lines = run_on_fixed_tasks(tmp_path, "code_rl.py", BATCH, [
        "seed=0", f"steps={STEPS}", f"batch_size={BATCH}", f"group_size={GROUP}", f"staleness={STALENESS}",
        "trainer.lr=1e-4", "trainer.warmup_steps=0", "eval.samples=16", f"eval.interval_steps={STEPS}",
        "checkpoint.interval_steps=0",
    ])
    steps = [x for x in lines if x["kind"] == "step"]
    evals = [x for x in lines if x["kind"] == "eval"]

    # learning: the mean test-pass fraction over 128 samples of the 8 tasks, warm start vs the end
    assert [e["version"] for e in evals] == [0, STEPS] and all(e["samples"] == BATCH * 16 for e in evals)
    first, last = evals[0]["reward_mean"], evals[-1]["reward_mean"]
    assert last >= first + 0.05, f"reward on the training set went {first:.3f} -> {last:.3f}"

    # the staleness bound held on every trained sample (the histogram is version lag -> samples)
    assert [s["version"] for s in steps] == list(range(1, STEPS + 1))
    lags = {int(lag) for s in steps for lag in s["staleness"]}
    assert lags and max(lags) <= STALENESS

    # nothing lost: trained = generated (started) - failed - still in flight at the stop
    end = steps[-1]
    assert end["trained"] == STEPS * BATCH * GROUP
    assert end["trained"] == end["started"] - end["failed"] - end["in_flight"]
    assert end["duplicates_dropped"] == 0

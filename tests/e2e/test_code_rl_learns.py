"""`areal run recipes/code_rl.py` on a fixed set of training tasks: the policy visibly learns.

The held-out file is the training file itself, so the eval rounds measure reward on the fixed
training set; version 0 is the warm-start policy. Seeded, so a rerun samples the same tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from areal.data.code_tasks import builtin_code_tasks

ROOT = Path(__file__).resolve().parents[2]
STALENESS = 2
BATCH, GROUP, STEPS = 8, 8, 40


def write_tasks(path: Path, n: int) -> None:
    """n built-in training tasks as JSONL records of the code schema."""
    records = [
        {"task_id": t["task_id"], "prompt": t["prompt"], "fn_name": t["tests"]["fn_name"],
         "inputs": t["tests"]["inputs"], "outputs": t["tests"]["outputs"]}
        for t in builtin_code_tasks("train", seed=0, n=n).tasks
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.mark.slow  # ~2 min on 2 cores (plus the one-off warm start when it is not cached)
def test_reward_on_a_fixed_training_set_rises_within_the_staleness_bound_and_nothing_is_lost(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, BATCH)
    run = tmp_path / "run"
    settings = [
        f"data.path={tasks}", f"data.heldout_path={tasks}", "seed=0", f"steps={STEPS}",
        f"batch_size={BATCH}", f"group_size={GROUP}", f"staleness={STALENESS}", "trainer.lr=1e-4",
        "trainer.warmup_steps=0", f"eval.tasks={BATCH}", "eval.samples=16", f"eval.interval_steps={STEPS}",
        "checkpoint.interval_steps=0",
    ]
    cmd = [sys.executable, "-m", "areal.cli", "run", str(ROOT / "recipes" / "code_rl.py"), "--run-dir", str(run),
           "-q", *(arg for s in settings for arg in ("--set", s))]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "1000"})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
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

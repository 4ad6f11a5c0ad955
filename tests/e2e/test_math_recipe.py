"""`areal run recipes/math_rl.py --set data.path=problems.jsonl` on CPU, as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.local_model import make_checkpoint

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "math_rl.py"
PROBLEMS = [
    {"problem": "What is $2 + 3$?", "answer": "5"},
    {"question": "What is half of 3?", "solution": "Half of 3 is $\\boxed{\\frac{3}{2}}$."},
    {"id": 7, "problem": "Compute $6 \\times 7$.", "answer": 42},
]


def areal_run(*args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "areal.cli", "run", str(RECIPE), "-q", *args]
    wide = {**os.environ, "COLUMNS": "1000"}  # rich wraps stderr at 80 columns when it is not a terminal
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=wide)


@pytest.mark.slow  # 23-48 s on 2 shared cores: four worker processes each import torch
def test_math_recipe_trains_on_a_jsonl_file_and_scores_rewards_in_0_1(tmp_path):
    data = tmp_path / "problems.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    run = tmp_path / "run"
    # pass@1 on the built-in arithmetic test split, named (with a file of one's own and none named: no rounds)
    settings = [
        f"data.path={data}",
        "data.heldout_path=builtin:math",
        f"model={make_checkpoint(tmp_path / 'ckpt')}",
        "steps=2",
        "batch_size=2",
        "group_size=2",
        "generation.max_new_tokens=8",
        "eval.tasks=3",
        "checkpoint.interval_steps=0",
    ]
    done = areal_run("--run-dir", str(run), *(arg for s in settings for arg in ("--set", s)), timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["kind"] == "step"]
    evals = [x for x in lines if x["kind"] == "eval"]
    assert [s["version"] for s in steps] == [1, 2] and all(s["samples"] == 4 and s["failed"] == 0 for s in steps)
    assert [e["tasks"] for e in evals] == [3, 3] and all(e["failed"] == 0 for e in evals)
    for record in steps + evals:
        assert isinstance(record["reward_mean"], float) and 0.0 <= record["reward_mean"] <= 1.0
    config = json.loads((run / "config.json").read_text())
    assert config["data"]["path"] == str(data) and config["generation"]["stop"] == []


def test_a_missing_problem_file_is_named_with_its_config_key_and_exits_2(tmp_path):
    missing = tmp_path / "problems.jsonl"
    # the built-in model: the data error comes before its warm start, which could take minutes
    done = areal_run("--run-dir", str(tmp_path / "run"), "--set", f"data.path={missing}", timeout_s=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.startswith(f"data.path: jsonl_tasks: task file {missing} does not exist (cwd: ")
    assert "Traceback" not in done.stderr


def test_the_recipe_as_shipped_trains_the_tiny_mather_which_writes_worked_answers(tmp_path):
    run = tmp_path / "run"
    settings = ["steps=2", "eval.tasks=64", "checkpoint.interval_steps=0"]
    done = areal_run("--run-dir", str(run), *(arg for s in settings for arg in ("--set", s)), timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["kind"] == "step"]
    first_eval = next(x for x in lines if x["kind"] == "eval")
    assert [s["version"] for s in steps] == [1, 2] and all(s["empty_share"] == 0 for s in steps)
    # it answers some problems and not others (about 2 in 5 at T=1): groups with both, so RL has a signal
    assert all(0 < s["reward_mean"] < 1 for s in steps) and 0.15 < first_eval["pass@1"] < 0.75
    assert json.loads((run / "config.json").read_text())["model"] == "builtin:tiny-mather"

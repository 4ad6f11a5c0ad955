"""The judge's child process: a pathological answer is killed at its time limit, scored 0 with the reason,
and the next answers are judged by a fresh child."""

from __future__ import annotations

import os
import time

import pytest
import torch

from areal.graph.batch import Batch
from areal.graph.roles import FAILED
from areal.nodes.workers.reward import RewardNode
from areal.rewards.math.answer import MathReward
from areal.rewards.math.judge import MathJudge, Verdict

pytest.importorskip("math_verify")

PATHOLOGICAL = "3^{3^{20}}"  # math-verify reads it lazily; its exact value has 1.7 billion digits


def test_a_check_past_its_limit_is_killed_by_pid_and_the_next_check_gets_a_fresh_child():
    judge = MathJudge()
    try:
        assert judge.check("2", "x", timeout_s=5.0) == Verdict("different")  # started: the start is not timed
        first = judge.pid
        start = time.monotonic()
        verdict = judge.check("1", PATHOLOGICAL, timeout_s=0.5)
        elapsed = time.monotonic() - start
        assert verdict == Verdict("timeout", "no verdict within 0.5 s: the judge process was killed")
        assert elapsed < 0.5 + 1.0, elapsed
        with pytest.raises(ProcessLookupError):
            os.kill(first, 0)  # killed and reaped, not left computing
        assert judge.check(r"\sqrt{4}", "2", timeout_s=5.0) == Verdict("equal")
        assert judge.pid not in (None, first)
    finally:
        judge.close()
    assert judge.pid is None


def test_a_pathological_answer_scores_0_with_its_reason_and_the_batch_goes_on():
    completions = [r"\boxed{\frac{1}{2}}", rf"\boxed{{{PATHOLOGICAL}}}", r"\boxed{2\sqrt{2}}"]
    references = ["0.5", "1", r"\sqrt{8}"]
    with MathReward(timeout_s=1.0) as reward:
        results = reward(completions, references)
        out = RewardNode(reward)(Batch({"completion": completions, "answer": references, "sample_id": torch.arange(3)}))
    assert [(r.reward, r.reason) for r in results] == [(1.0, None), (0.0, "check_timeout"), (1.0, None)]
    assert results[1].detail == "no verdict within 1 s: the judge process was killed"
    # a timeout is the answer's doing, not the machinery's: scored 0, not a failed sample
    assert out["reward"].tolist() == [1.0, 0.0, 1.0] and out[FAILED] == {}


def test_an_answer_sympy_or_python_refuses_is_a_wrong_answer_not_a_broken_judge():
    judge = MathJudge()
    try:
        too_long = judge.check("1", r"0.\overline{" + "3" * 6000 + "}", timeout_s=10.0)  # past int's 4300 digits
    finally:
        judge.close()
    assert too_long.outcome == "different" and too_long.detail.startswith("ValueError: Exceeds the limit")

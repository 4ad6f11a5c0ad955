"""pass@1's standard error and the run's verdict, against a float64 reference and simulated rounds."""

from __future__ import annotations

import math
import random

import pytest

from areal.runtime.learning import pass_at_1_error, verdict


def test_the_error_is_the_spread_of_pass_at_1_over_repeated_rounds():
    """Simulate many rounds of the same 300 tasks at k samples each: the formula's error matches the spread of
    the rounds' pass@1 (which is what it claims to be), within 10 %."""
    rng = random.Random(0)
    rates = [rng.choice([0.0, 0.05, 0.3, 0.6, 0.95, 1.0]) for _ in range(300)]
    for k in (2, 4):
        rounds = []
        errors = []
        for _ in range(400):
            solved = [sum(rng.random() < p for _ in range(k)) for p in rates]
            rounds.append(sum(solved) / (k * len(rates)))
            errors.append(pass_at_1_error(solved, k))
        mean = sum(rounds) / len(rounds)
        spread = math.sqrt(sum((r - mean) ** 2 for r in rounds) / (len(rounds) - 1))
        assert sum(errors) / len(errors) == pytest.approx(spread, rel=0.1)


def test_one_sample_per_task_uses_the_binomial_bound_and_no_tasks_have_no_error():
    assert pass_at_1_error([1, 0, 0, 1], 1) == pytest.approx(math.sqrt(0.5 * 0.5 / 4))
    assert math.isnan(pass_at_1_error([], 2))


def test_the_verdict_says_learned_only_beyond_two_standard_errors():
    first = {"pass@1": 0.20, "pass@1_se": 0.01}
    assert verdict(first, {"pass@1": 0.36, "pass@1_se": 0.01}) == "+16.0 ± 1.4 points: learned"
    assert verdict(first, {"pass@1": 0.22, "pass@1_se": 0.01}) == "+2.0 ± 1.4 points: within noise"
    assert verdict(first, {"pass@1": 0.15, "pass@1_se": 0.01}) == "-5.0 ± 1.4 points: fell"
    assert verdict({"pass@1": 0.2}, {"pass@1": 0.3}) == "+10.0 points"


def test_a_rounds_error_counts_each_tasks_own_samples():
    from areal.runtime.evaluation import HeldOut

    held = HeldOut([{"task_id": "a"}, {"task_id": "b"}, {"task_id": "c"}], samples=2)
    _, meta = held.start(0, lambda tasks, groups: groups)
    ids = [-i - 1 for i in range(6)]  # round 0: copy i is sample -(i) - 1, copies 2t and 2t+1 are task t
    # task a solved twice, b once, c never: pass@1 = 3/6; per-task rates 1, 0.5, 0
    record = held.scored(0, ids, [1.0, 1.0, 1.0, 0.0, 0.0, 0.0], [True, True, True, False, False, False])
    assert record["pass@1"] == 0.5 and record["tasks"] == 3
    assert record["pass@1_se"] == pytest.approx(pass_at_1_error([2, 1, 0], 2)) == pytest.approx(
        math.sqrt(0.5 * 0.5 / 1) / 3)

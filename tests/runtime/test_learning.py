"""pass@1's standard error and the run's verdict, against a float64 reference and simulated rounds."""

from __future__ import annotations

import math
import random

import pytest

from areal.runtime.records.evaluation import CHUNK_SAMPLES, HeldOut
from areal.runtime.records.learning import pass_at_1_error, verdict


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
    held = HeldOut([{"task_id": "a"}, {"task_id": "b"}, {"task_id": "c"}], samples=2)
    held.start(0, lambda tasks, groups: groups)
    ids = [-i - 1 for i in range(6)]  # round 0: copy i is sample -(i) - 1, copies 2t and 2t+1 are task t
    # task a solved twice, b once, c never: pass@1 = 3/6; per-task rates 1, 0.5, 0
    record = held.scored(0, ids, [1.0, 1.0, 1.0, 0.0, 0.0, 0.0], [True, True, True, False, False, False])
    assert record["pass@1"] == 0.5 and record["tasks"] == 3
    assert record["pass@1_se"] == pytest.approx(pass_at_1_error([2, 1, 0], 2)) == pytest.approx(
        math.sqrt(0.5 * 0.5 / 1) / 3)


@pytest.mark.parametrize(("rewards", "solved", "warned"), [
    ([0.97, 0.4, 0.0, 0.0], [False] * 4, "none_solved"),  # a combined reward that never reaches 1: pass@1 0, said
    ([0.0] * 4, [False] * 4, None),  # nothing earned anything: a weak model, nothing to say
    ([1.0, 0.4, 0.0, 0.0], [True, False, False, False], None),  # one solved
    ([1.1, 0.1, 1.0, 0.0], [True, False, True, False], None),  # a shaped reward: 1 and a bonus
    ([7.5, 3.0, 1.0, 0.0], [True, True, True, False], "above_solved"),  # a 0-10 scale: 3 of 10 counted solved
])
def test_a_round_whose_rewards_are_not_on_the_solved_scale_says_what_counts_as_solved(rewards, solved,
                                                                                                warned):
    from areal.runtime.records.steps import StepRecorder

    held = HeldOut([{"task_id": "a"}, {"task_id": "b"}], samples=2)
    held.start(0, lambda tasks, groups: groups)
    record = held.scored(0, [-1, -2, -3, -4], rewards, solved) | {"wall_s": 1.0}
    assert record["reward_max"] == max(rewards)
    recorder = StepRecorder(0, 8, False, ("combine.reward", 1.0))
    said = recorder.warnings(record)
    assert list(recorder.said) == ([warned] if warned else [])
    if warned == "none_solved":
        assert said[0]["warning"].startswith("no sample of the held-out round at version 0 counted as solved "
                                             "(combine.reward ≥ 1), though its rewards reached 0.97")
        assert "eval.solved=NODE.PORT" in said[0]["warning"]
    if warned == "above_solved":
        assert said[0]["warning"].startswith("the held-out round at version 0 has rewards up to 7.5, several times the "
                                             "1 from which a sample counts as solved (combine.reward ≥ 1): if the "
                                             "reward's scale is not 0 to 1, set eval.solved_at")


def _task_batch(tasks: list[dict], groups: list[int]):
    import torch

    from areal.graph.batch import Batch

    return Batch({"task_id": [t["task_id"] for t in tasks], "group_id": torch.tensor(groups)})


def test_a_round_goes_out_in_chunks_of_whole_tasks_and_ends_with_its_last_sample():
    """5 tasks x 8 samples, 16 samples a chunk: three chunks (2, 2 and 1 tasks), every copy in exactly one, each
    chunk's task ids its own; the record comes when the last chunk is scored, and only unscored chunks are
    sent again after a crash."""
    assert CHUNK_SAMPLES == 16
    tasks = [{"task_id": name} for name in "abcde"]
    held = HeldOut(tasks, samples=8, first_round=3)
    chunks = held.start(7, _task_batch)
    assert [b.size for b, _ in chunks] == [16, 16, 8]
    ids = [g for b, _ in chunks for g in b["group_id"].tolist()]
    assert ids == [-(3 * 1_000_000 + i) - 1 for i in range(40)]
    for batch, meta in chunks:
        assert meta.eval and meta.round == 3 and meta.admitted_at == 7 and meta.samples == 1
        assert meta.group == batch["group_id"][0].item()
        assert list(meta.task_ids) == batch["task_id"] and len(set(meta.task_ids)) * 8 == batch.size
    solved_by_task = {"a": 8, "b": 4, "c": 0, "d": 2, "e": 8}
    for batch, _ in chunks[:2]:
        names = batch["task_id"]
        solved = [k < solved_by_task[n] for n in sorted(set(names)) for k in range(8)]
        assert held.scored(3, batch["group_id"].tolist(), [float(x) for x in solved], solved) is None
    assert [m.group for _, m in held.in_flight()] == [chunks[2][1].group]  # a crash now: only the last again
    record = held.scored(3, chunks[2][0]["group_id"].tolist(), [1.0] * 8, [True] * 8)
    assert record["pass@1"] == pytest.approx(22 / 40) and record["tasks"] == 5 and record["version"] == 7
    assert record["pass@1_se"] == pytest.approx(pass_at_1_error([8, 4, 0, 2, 8], 8))
    assert held.in_flight() == [] and not held.pending


def test_a_task_with_more_samples_than_a_chunk_is_a_chunk_of_its_own():
    held = HeldOut([{"task_id": "a"}, {"task_id": "b"}], samples=CHUNK_SAMPLES + 4)
    chunks = held.start(0, _task_batch)
    assert [b.size for b, _ in chunks] == [CHUNK_SAMPLES + 4] * 2
    assert [set(m.task_ids) for _, m in chunks] == [{"a"}, {"b"}]


def test_a_sample_that_failed_and_was_then_scored_again_counts_once():
    """A re-sent copy may be scored after the first failed: the round still waits for its other samples."""
    held = HeldOut([{"task_id": "a"}], samples=2)
    held.start(0, _task_batch)
    first, second = -1, -2
    assert held.failed([first]) == []
    assert held.scored(0, [first], [1.0], [True]) is None  # one sample answered twice, one still out
    assert [m.group for _, m in held.in_flight()] == [first]  # the chunk holding the unanswered one
    record = held.scored(0, [second], [0.0], [False])
    assert record["samples"] == 2 and record["failed"] == 1 and record["pass@1"] == 0.5

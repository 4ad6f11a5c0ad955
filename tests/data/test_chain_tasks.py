from __future__ import annotations

import math
import random
import statistics
from collections import Counter

from areal.data.builtin import split_of
from areal.data.chain_tasks import MAX_STEPS, MEDIAN_STEPS, N_TASKS, SIGMA, builtin_chain_tasks, chain_share, chain_task
from areal.data.code_tasks import builtin_code_tasks


def _all():
    return builtin_chain_tasks("train").tasks + builtin_chain_tasks("test").tasks


def test_a_chain_applies_its_update_once_per_line():
    task = chain_task("n", "*", 3, 4)
    assert task["prompt"] == "# n: *3 *3 *3 *3\ndef f(n):\n"
    assert task["solution"] == "    n *= 3\n" * 4 + "    return n\n"
    tests = task["tests"]
    assert tests["outputs"] == [x * 81 for [x] in tests["inputs"]] and len(set(tests["outputs"])) > 1
    assert task["difficulty"] == 4


def test_every_reference_body_passes_its_tests_and_the_split_is_by_id():
    train, test = builtin_chain_tasks("train"), builtin_chain_tasks("test")
    assert {t["task_id"] for t in train.tasks}.isdisjoint(t["task_id"] for t in test.tasks)
    assert {t["prompt"] for t in train.tasks}.isdisjoint(t["prompt"] for t in test.tasks)
    assert all(split_of(t["task_id"]) == "test" for t in test.tasks) and len(test) > 100
    for task in _all():
        namespace: dict = {}
        exec(task["prompt"] + task["solution"], namespace)
        assert [namespace["f"](*args) for args in task["tests"]["inputs"]] == task["tests"]["outputs"]


def test_the_tasks_per_chain_length_follow_the_log_normal_against_a_sampled_one():
    assert math.isclose(sum(chain_share(k) for k in range(1, MAX_STEPS + 1)), 1.0)
    rng = random.Random(0)
    drawn = Counter(min(MAX_STEPS, max(1, round(rng.lognormvariate(math.log(MEDIAN_STEPS), SIGMA))))
                    for _ in range(200_000))
    for k in (1, 2, 5, 10):
        assert abs(chain_share(k) - drawn[k] / 200_000) < 0.004, k
    counts = Counter(t["difficulty"] for t in _all())
    assert abs(len(_all()) - N_TASKS) <= 5
    assert all(abs(counts[k] - N_TASKS * chain_share(k)) <= 1 for k in range(1, MAX_STEPS + 1))


def test_the_answers_have_the_tail_the_built_in_code_tasks_lack():
    chains = sorted(len(t["solution"]) for t in _all())
    code = sorted(len(t["solution"]) for t in builtin_code_tasks("train").tasks)
    assert chains[-1] > 6 * statistics.mean(chains) and chains[-1] > 4 * code[-1]
    assert code[-1] < 2 * statistics.mean(code) + 30  # the built-in answers have no tail
    assert max(len(t["prompt"]) + len(t["solution"]) for t in _all()) < 512  # the tiny coder's context


def test_every_expected_output_fits_the_wire_s_64_bit_integers():
    outputs = [o for t in _all() for o in t["tests"]["outputs"]]
    assert max(abs(o) for o in outputs) < 2**63 and max(abs(o) for o in outputs) > 2**40  # long products remain

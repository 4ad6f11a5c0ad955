from __future__ import annotations

import json
import re
from fractions import Fraction

import pytest

from areal.data.builtin import split_of
from areal.data.math_tasks import builtin_math_tasks, latex
from areal.errors import ConfigError
from areal.rewards.math.answer import MathReward


def _value(expr: str) -> Fraction:
    """An independent reading of a task's expression: LaTeX to Python over Fractions."""
    python = re.sub(r"\\frac\{(\d+)\}\{(\d+)\}", r"Fraction(\1, \2)", expr).replace("\\times", "*")
    return eval(python, {"Fraction": Fraction})  # our own generated text, never a model's


def test_every_answer_is_the_exact_value_of_its_expression():
    for task in builtin_math_tasks("train").tasks + builtin_math_tasks("test").tasks:
        expr = re.fullmatch(r"What is \$(.+)\$\? Put your final answer within \\boxed\{\}\.\n", task["prompt"]).group(1)
        assert task["task_id"].endswith("/" + expr)
        assert task["answer"] == latex(_value(expr)), task["task_id"]


def test_the_math_reward_accepts_each_boxed_answer_and_rejects_its_neighbour():
    tasks = builtin_math_tasks("test").tasks
    with MathReward(timeout_s=2.0) as reward:
        right = reward([f"so \\boxed{{{t['answer']}}}" for t in tasks], [t["answer"] for t in tasks])
        wrong = reward(
            [f"\\boxed{{{latex(_value(t['task_id'].split('/', 1)[1]) + 1)}}}" for t in tasks],
            [t["answer"] for t in tasks],
        )
    assert {r.reward for r in right} == {1.0} and {r.reason for r in wrong} == {"wrong_answer"}


def test_fractions_are_reduced_and_negatives_keep_their_sign():
    assert [latex(Fraction(-7)), latex(Fraction(7, 12)), latex(Fraction(-2, 4))] == [
        "-7",
        "\\frac{7}{12}",
        "-\\frac{1}{2}",
    ]


def test_train_and_test_never_share_a_task_and_the_split_follows_the_id():
    train, test = builtin_math_tasks("train"), builtin_math_tasks("test")
    ids = [t["task_id"] for t in train.tasks], [t["task_id"] for t in test.tasks]
    assert set(ids[0]).isdisjoint(ids[1]) and all(split_of(i) == "test" for i in ids[1])
    assert 0.1 < len(test) / (len(train) + len(test)) < 0.3
    assert {i.split("/")[0] for i in ids[1]} == {"add", "sub", "mul", "order", "frac"}


def test_cursor_resumes_on_the_very_next_task():
    source = builtin_math_tasks("train", seed=3, n=5)
    for _ in range(7):
        next(source)
    saved = json.loads(json.dumps(source.state()))
    expected = [next(source)["task_id"] for _ in range(6)]
    resumed = builtin_math_tasks("train", seed=3, n=5)
    resumed.restore(saved)
    assert [next(resumed)["task_id"] for _ in range(6)] == expected


def test_bad_split_and_n_name_the_builtin_math_tasks():
    with pytest.raises(ConfigError, match="builtin_math_tasks: unknown split 'dev'; use one of train, test"):
        builtin_math_tasks("dev")
    with pytest.raises(ConfigError, match="builtin_math_tasks: n=0 is out of range"):
        builtin_math_tasks("test", n=0)

from __future__ import annotations

import json
import re
from fractions import Fraction

import pytest

from areal.data.builtin import split_of
from areal.data.math_tasks import builtin_math_tasks, latex
from areal.errors import ConfigError
from areal.models.builtin_weights import training_tasks
from areal.rewards.math.answer import MathReward


def _value(expr: str) -> Fraction:
    """An independent reading of a task's expression: LaTeX to Python over Fractions."""
    python = re.sub(r"\\frac\{([^{}]+)\}\{([^{}]+)\}", r"Fraction(\1, \2)", expr).replace("\\times", "*")
    return Fraction(eval(python, {"Fraction": Fraction}))  # our own generated text, never a model's


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


def test_every_step_of_each_worked_solution_is_true_and_the_math_reward_pays_for_it():
    tasks = builtin_math_tasks("train").tasks + builtin_math_tasks("test").tasks
    for task in tasks:
        steps = re.findall(r"\$([^$]+)\$", task["solution"])
        assert steps and task["solution"].endswith(f"$. \\boxed{{{task['answer']}}}"), task["solution"]
        for step in steps:  # each `a = b = c` holds, and the last side of the last step is the answer
            sides = [_value(side) for side in step.split(" = ")]
            assert len(sides) > 1 and len(set(sides)) == 1, (task["task_id"], step)
        assert steps[-1].split(" = ")[-1] == task["answer"]
    with MathReward(timeout_s=2.0, use_prompt=True) as reward:
        scored = reward([t["solution"] for t in tasks], [t["answer"] for t in tasks], [t["prompt"] for t in tasks])
    assert [r.reason for r in scored if r.reward != 1.0] == []


def test_the_tiny_mather_learned_the_train_split_and_never_saw_a_held_out_task():
    taught = training_tasks("tiny-mather")
    assert [t["task_id"] for t in taught] == [t["task_id"] for t in builtin_math_tasks("train").tasks]
    assert all(t["solution"] for t in taught)
    assert {t["task_id"] for t in taught}.isdisjoint(t["task_id"] for t in builtin_math_tasks("test").tasks)


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

from __future__ import annotations

import json

import pytest

from areal.data.builtin import split_of
from areal.data.code_tasks import builtin_code_tasks
from areal.errors import ConfigError


def _ids(source):
    return [t["task_id"] for t in source.tasks]


def test_same_seed_same_tasks_and_order_other_seed_other_order():
    a, b, c = (builtin_code_tasks("train", seed=s) for s in (0, 0, 1))
    first = [next(a)["task_id"] for _ in range(20)]
    assert first == [next(b)["task_id"] for _ in range(20)]
    assert first != [next(c)["task_id"] for _ in range(20)]
    assert _ids(builtin_code_tasks("test", seed=3, n=10)) == _ids(builtin_code_tasks("test", seed=3, n=10))


def test_train_and_test_never_share_a_task_or_a_program():
    train, test = builtin_code_tasks("train"), builtin_code_tasks("test")
    assert set(_ids(train)).isdisjoint(_ids(test))
    assert {t["prompt"] for t in train.tasks}.isdisjoint(t["prompt"] for t in test.tasks)
    assert all(split_of(i) == "test" for i in _ids(test))
    assert 0.1 < len(test) / (len(train) + len(test)) < 0.3


def test_every_reference_solution_passes_its_own_tests():
    for task in builtin_code_tasks("train").tasks + builtin_code_tasks("test").tasks:
        namespace: dict = {}
        exec(task["prompt"] + task["solution"], namespace)
        tests = task["tests"]
        assert tests["kind"] == "call" and tests["fn_name"] == "f" and 3 <= len(tests["inputs"]) <= 5
        assert [namespace["f"](*args) for args in tests["inputs"]] == tests["outputs"], task["task_id"]


def test_tests_reject_a_constant_answer():
    for task in builtin_code_tasks("test").tasks:
        assert len({json.dumps(o) for o in task["tests"]["outputs"]}) > 1, task["task_id"]


def test_tasks_are_short_json_and_cover_three_difficulties():
    tasks = builtin_code_tasks("train").tasks
    assert max(len(t["prompt"]) for t in tasks) < 80
    assert max(len(t["solution"]) for t in tasks) < 60
    assert {t["difficulty"] for t in tasks} == {1, 2, 3}
    assert json.loads(json.dumps(tasks[0])) == tasks[0]


def test_cursor_resumes_on_the_very_next_task_across_epochs():
    source = builtin_code_tasks("train", seed=5, n=7)
    for _ in range(10):  # past the end of epoch 0
        next(source)
    saved = json.loads(json.dumps(source.state()))
    expected = [next(source)["task_id"] for _ in range(12)]
    resumed = builtin_code_tasks("train", seed=5, n=7)
    resumed.restore(saved)
    assert [next(resumed)["task_id"] for _ in range(12)] == expected


def test_each_epoch_visits_every_task_once_in_a_new_order():
    source = builtin_code_tasks("train", seed=0, n=9)
    epochs = [[next(source)["task_id"] for _ in range(len(source))] for _ in range(2)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == sorted(_ids(source))
    assert epochs[0] != epochs[1]


def test_restore_refuses_a_cursor_from_another_source():
    state = builtin_code_tasks("train", seed=0).state()
    with pytest.raises(ConfigError, match="different task source"):
        builtin_code_tasks("train", seed=1).restore(state)


def test_bad_split_and_n_are_config_errors():
    with pytest.raises(ConfigError, match="unknown split 'dev'; use one of train, test"):
        builtin_code_tasks("dev")
    with pytest.raises(ConfigError, match="n=0 is out of range"):
        builtin_code_tasks("test", n=0)

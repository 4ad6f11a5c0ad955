from __future__ import annotations

import json

import pytest

from areal import RunConfig
from areal.data import BuiltinTaskSource, TaskFileSource, code_tasks, math_tasks
from areal.data.sources import heldout_note
from areal.errors import ConfigError


def test_math_tasks_read_data_path_with_the_math_schema_else_the_builtin_set(tmp_path):
    data = tmp_path / "problems.jsonl"
    data.write_text(json.dumps({"problem": "What is $1+1$?", "answer": 2}) + "\n")
    config = RunConfig(data={"path": str(data)})
    train = math_tasks("train").configure(config)
    assert isinstance(train, TaskFileSource) and train.fields == math_tasks("train").fields
    assert next(iter(train)) == {"task_id": "problems.jsonl:1", "prompt": "What is $1+1$?", "answer": "2"}
    assert math_tasks("test").configure(config) is None  # a file of one's own and no data.heldout_path: none
    assert "data.heldout_path=builtin:math" in heldout_note(math_tasks("test"), config)
    assert heldout_note(math_tasks("test"), RunConfig()) is None
    same = RunConfig(data={"path": str(data), "heldout_path": str(tmp_path / "." / "problems.jsonl")})
    assert "held-out pass@1 scores tasks the run trains on" in heldout_note(math_tasks("test"), same)
    other = tmp_path / "test.jsonl"
    other.write_text(data.read_text())
    assert heldout_note(math_tasks("test"), RunConfig(data={"path": str(data), "heldout_path": str(other)})) is None
    heldout = math_tasks("test").configure(RunConfig())  # no data.path: the built-in test split
    assert isinstance(heldout, BuiltinTaskSource) and heldout.split == "test"
    # a built-in task also holds the worked solution the tiny mather learned; the source's ports are the schema's
    assert set(next(heldout)) == {"task_id", "prompt", "answer", "solution"}
    assert math_tasks("test").fields == ("task_id", "prompt", "answer")


def test_reading_a_config_chosen_source_outside_a_run_says_how_to_read_its_tasks():
    with pytest.raises(TypeError, match=r"^code_tasks\('train'\) stands for the tasks a run's config names .*: "
                                        r"code_tasks\('train'\).configure\(RunConfig\(\)\) .*, or "
                                        r"builtin_code_tasks\('train'\) for the built-in set$"):
        next(iter(code_tasks("train")))
    assert set(next(iter(code_tasks("train").configure(RunConfig())))) >= set(code_tasks("train").fields)


def test_a_bad_data_file_is_named_with_its_config_key(tmp_path):
    code = tmp_path / "code.jsonl"
    code.write_text(json.dumps({"prompt": "def f(x):\n", "fn_name": "f", "inputs": [[1]], "outputs": [2]}) + "\n")
    with pytest.raises(ConfigError, match=r"^data\.heldout_path: .* task file \S+missing\.jsonl does not exist"):
        math_tasks("test").configure(RunConfig(data={"heldout_path": str(tmp_path / "missing.jsonl")}))
    with pytest.raises(
        ConfigError, match=r"(?s)^data\.path: \S+code\.jsonl: no valid task record.*:1: missing 'answer'"
    ):
        math_tasks("train").configure(RunConfig(data={"path": str(code)}))
    assert repr(code_tasks("test")) == "code_tasks('test')" and code_tasks().fields == ("task_id", "prompt", "tests")


def test_builtin_name_picks_another_builtin_set_and_the_heldout_split_follows_it():
    config = RunConfig(data={"path": "builtin:chains"})
    train, heldout = code_tasks("train").configure(config), code_tasks("test").configure(config)
    assert (train.split, heldout.split) == ("train", "test")
    assert all(t["task_id"].startswith("chain/") for t in train.tasks + heldout.tasks)
    mixed = RunConfig(data={"path": "builtin:chains", "heldout_path": "builtin:code"})
    assert not any(t["task_id"].startswith("chain/") for t in code_tasks("test").configure(mixed).tasks)
    with pytest.raises(ConfigError, match=r"^data\.heldout_path: no built-in code tasks named 'chain'; known: "
                                          r"builtin:code, builtin:chains\.$"):
        code_tasks("test").configure(RunConfig(data={"heldout_path": "builtin:chain"}))
    with pytest.raises(ConfigError, match=r"^data\.path: no built-in math tasks named 'chains'"):
        math_tasks("train").configure(config)

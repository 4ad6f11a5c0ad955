"""verl's record layout (chat messages under `prompt`, the answer or tests in `reward_model.ground_truth`) read as
areal's own, and a Parquet file handed to the JSONL reader named as such. Parquet itself: test_parquet.py."""

from __future__ import annotations

import json
import sys

import pytest

from areal import RunConfig
from areal.data import code_tasks, math_tasks
from areal.data.jsonl import jsonl_tasks
from areal.errors import ConfigError
from tests.data.test_jsonl import take, write_jsonl

QUESTION = [{"role": "system", "content": "Think."}, {"role": "user", "content": "Natalia sold 48 clips ..."}]


def verl_row(ground_truth, ability: str = "math", **extra) -> dict:
    return {"data_source": "openai/gsm8k", "prompt": QUESTION, "ability": ability,
            "reward_model": {"style": "rule", "ground_truth": ground_truth}, "extra_info": {"index": 0}, **extra}


def test_a_verl_math_row_is_a_math_task_with_its_ground_truth_and_its_prompt_messages_rendered(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", [verl_row("72"), verl_row(5)])
    source = jsonl_tasks(path, shuffle=False)
    assert source.schema == "math"
    assert take(source, 2) == [
        {"task_id": "gsm8k.jsonl:1", "prompt": QUESTION, "answer": "72"},
        {"task_id": "gsm8k.jsonl:2", "prompt": QUESTION, "answer": "5"},
    ]
    templated = next(jsonl_tasks(path, chat_template=lambda ms: "|".join(m["role"] for m in ms)))
    assert templated["prompt"] == "system|user"


def test_a_verl_code_row_takes_its_tests_from_the_ground_truth_as_json_text_or_an_object(tmp_path):
    stdio = {"inputs": ["1 2\n"], "outputs": ["3\n"]}
    call = {"fn_name": "add", "inputs": [[1, 2]], "outputs": [3]}
    path = write_jsonl(tmp_path / "code.jsonl", [verl_row(json.dumps(stdio), "code"), verl_row(call, "code")])
    source = jsonl_tasks(path, shuffle=False)
    assert source.schema == "code"
    assert [t["tests"] for t in take(source, 2)] == [{"kind": "stdio", **stdio}, {"kind": "call", **call}]


def test_an_answer_column_wins_over_the_ground_truth_and_the_ground_truth_over_a_worked_solution(tmp_path):
    path = write_jsonl(tmp_path / "both.jsonl", [verl_row("72", answer="seventy-two"),
                                                 verl_row("72", solution="48 + 24 = \\boxed{72}, after work")])
    assert [t["answer"] for t in take(jsonl_tasks(path, shuffle=False), 2)] == ["seventy-two", "72"]


@pytest.mark.parametrize(("record", "message"), [
    ({"prompt": QUESTION, "reward_model": {"style": "rule"}}, "'reward_model' is an object without 'ground_truth'"),
    ({"prompt": QUESTION, "reward_model": "72"}, "'reward_model' is a string without 'ground_truth'"),
    (verl_row(" "), "'reward_model.ground_truth' is empty"),
    ({**verl_row("72"), "prompt": [{"role": "user"}]}, "'prompt'[0] must be {'role': str, 'content': str}"),
    ({**verl_row("72"), "prompt": []}, "'prompt' must be a non-empty list"),
])
def test_a_malformed_verl_row_is_skipped_and_named_by_its_field(tmp_path, record, message):
    path = write_jsonl(tmp_path / "rows.jsonl", [record, verl_row("1")])
    source = jsonl_tasks(path, schema="math", shuffle=False)
    assert next(source)["task_id"] == "rows.jsonl:2"
    assert source.skipped == 1 and message in source.problems[0], source.problems


def test_a_verl_code_row_with_unreadable_tests_names_the_ground_truth(tmp_path):
    tests = '{"inputs": ["1"], "outputs": ["1"]}'
    path = write_jsonl(tmp_path / "code.jsonl", [verl_row("{oops", "code"), verl_row(tests, "code")])
    source = jsonl_tasks(path, schema="code", shuffle=False)
    assert next(source)["task_id"] == "code.jsonl:2"
    assert "'reward_model.ground_truth' is not valid JSON" in source.problems[0]


def test_a_parquet_file_given_to_the_jsonl_reader_is_named_as_one(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(b"PAR1" + bytes(64) + b"PAR1")
    with pytest.raises(ConfigError, match=r"train\.jsonl is a Parquet file, not JSONL; read it with parquet_tasks"):
        jsonl_tasks(path)


def test_a_parquet_data_path_without_pyarrow_says_which_extra_to_install(tmp_path, monkeypatch):
    path = tmp_path / "train.parquet"
    path.write_bytes(b"PAR1" + bytes(64) + b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # an import of it raises ImportError
    for tasks in (math_tasks("train"), code_tasks("train")):
        with pytest.raises(ConfigError, match=r"^data\.path: parquet_tasks needs the 'pyarrow' package: "
                                              r"pip install .*'\.\[data\]'$"):
            tasks.configure(RunConfig(data={"path": str(path)}))

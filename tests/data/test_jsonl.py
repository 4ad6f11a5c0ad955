from __future__ import annotations

import itertools
import json
import logging
import re
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal.data.jsonl import jsonl_tasks
from areal.errors import ConfigError


def write_jsonl(path: Path, records: list) -> Path:
    """Records are dicts (written as JSON) or raw strings (written as they are)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def take(source, n: int) -> list[dict]:
    return list(itertools.islice(source, n))


def test_function_call_records_become_call_tests(tmp_path):
    path = write_jsonl(tmp_path / "calls.jsonl", [
        {"task_id": "add", "prompt": "def add(a, b):\n", "fn_name": "add",
         "inputs": [[1, 2], [3, 4]], "outputs": [3, 7]},
        {"id": 7, "question": "Write twice(x).", "fn_name": "twice", "inputs": [[2]], "outputs": [4]},
    ])
    source = jsonl_tasks(path, shuffle=False)
    assert source.schema == "code" and source.fields == ("task_id", "prompt", "tests")
    assert take(source, 2) == [
        {"task_id": "add", "prompt": "def add(a, b):\n",
         "tests": {"kind": "call", "fn_name": "add", "inputs": [[1, 2], [3, 4]], "outputs": [3, 7]}},
        {"task_id": "7", "prompt": "Write twice(x).",
         "tests": {"kind": "call", "fn_name": "twice", "inputs": [[2]], "outputs": [4]}},
    ]


def test_nested_input_output_string_and_starter_code(tmp_path):
    nested = json.dumps({"fn_name": "f", "inputs": [[1]], "outputs": [2]})
    stdio = json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})
    path = write_jsonl(tmp_path / "apps.jsonl", [
        {"question": "Add one.", "input_output": nested, "starter_code": "def f(x):\n"},
        {"question": "Sum two numbers.", "input_output": stdio, "starter_code": ""},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add one.\n"}],
         "input_output": nested, "starter_code": "def f(x):\n"},
    ])
    assert take(jsonl_tasks(path, shuffle=False), 3) == [
        {"task_id": "apps.jsonl:1", "prompt": "Add one.\n\ndef f(x):\n",
         "tests": {"kind": "call", "fn_name": "f", "inputs": [[1]], "outputs": [2]}},
        {"task_id": "apps.jsonl:2", "prompt": "Sum two numbers.",
         "tests": {"kind": "stdio", "inputs": ["1 2\n"], "outputs": ["3\n"]}},
        {"task_id": "apps.jsonl:3",  # the chat's last message asks for the starter code
         "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add one.\n\ndef f(x):\n"}],
         "tests": {"kind": "call", "fn_name": "f", "inputs": [[1]], "outputs": [2]}},
    ]


def test_stdio_records_and_chat_messages_with_and_without_a_template(tmp_path):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add two numbers."}]
    path = write_jsonl(tmp_path / "stdio.jsonl", [
        {"task_id": "s1", "messages": messages, "inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]},
    ])
    plain = next(jsonl_tasks(path))  # the chat itself: the generator renders it in its model's template
    assert plain == {"task_id": "s1", "prompt": messages,
                     "tests": {"kind": "stdio", "inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]}}
    templated = next(jsonl_tasks(path, chat_template=lambda ms: "".join(f"<{m['role']}>{m['content']}" for m in ms)))
    assert templated["prompt"] == "<system>Be brief.<user>Add two numbers."


def test_math_records_take_problem_question_or_prompt_and_answer_or_solution(tmp_path):
    path = write_jsonl(tmp_path / "math.jsonl", [
        {"problem": "1+1?", "answer": "2"},
        {"question": "Half of 1?", "answer": 0.5},
        {"prompt": "Solve 2x = 1.", "solution": r"So $x = \boxed{\frac12}$."},
        {"messages": [{"role": "user", "content": "3*3?"}], "answer": "9"},
    ])
    source = jsonl_tasks(path, schema="math", shuffle=False)
    assert source.fields == ("task_id", "prompt", "answer")
    assert take(source, 4) == [
        {"task_id": "math.jsonl:1", "prompt": "1+1?", "answer": "2"},
        {"task_id": "math.jsonl:2", "prompt": "Half of 1?", "answer": "0.5"},
        {"task_id": "math.jsonl:3", "prompt": "Solve 2x = 1.", "answer": r"So $x = \boxed{\frac12}$."},
        {"task_id": "math.jsonl:4", "prompt": [{"role": "user", "content": "3*3?"}], "answer": "9"},
    ]
    assert jsonl_tasks(path).schema == "math"  # auto


GOOD = {"prompt": "p", "fn_name": "f", "inputs": [[1]], "outputs": [1]}
MALFORMED = [
    ("{not json", "bad JSON"),
    ('["a", "list"]', "a record must be a JSON object, got a list"),
    ({"prompt": "p", "inputs": ["1\n"]}, r"missing 'outputs' \(a code task needs prompt, inputs, outputs\)"),
    ({"inputs": ["1\n"], "outputs": ["1\n"]}, "missing a prompt: one of 'prompt', 'question', 'messages'"),
    ({"prompt": 3, "inputs": ["1\n"], "outputs": ["1\n"]}, "'prompt' is a number, expected a string"),
    ({"prompt": "p", "inputs": "1\n", "outputs": ["1\n"]}, "'inputs' is a string, expected a list"),
    ({"prompt": "p", "inputs": ["1\n", "2\n"], "outputs": ["1\n"]}, "'inputs' has 2 items but 'outputs' has 1"),
    ({"prompt": "p", "inputs": [[1]], "outputs": ["1\n"]}, r"'inputs'\[0\] is a list; a stdin/stdout test"),
    ({"prompt": "p", "fn_name": "f", "inputs": [1], "outputs": [1]}, r"'inputs'\[0\] is a number; a function-call"),
    ({"prompt": "p", "fn_name": "no way", "inputs": [[1]], "outputs": [1]}, "'fn_name' is 'no way'"),
    ({"prompt": "p", "input_output": "{oops"}, "'input_output' is not valid JSON"),
    ({"messages": [{"role": "user"}], "inputs": ["1\n"], "outputs": ["1\n"]}, r"'messages'\[0\] must be"),
    ({"task_id": [1], **GOOD}, "'task_id'/'id' is a list"),
]


def test_every_malformed_record_is_named_by_line_counted_and_skipped(tmp_path, caplog):
    records = [GOOD]
    for record, _ in MALFORMED:
        records += [record, GOOD]
    path = write_jsonl(tmp_path / "tasks.jsonl", records)
    source = jsonl_tasks(path, schema="code", shuffle=False)
    with caplog.at_level(logging.WARNING, logger="areal.data.task_file"):
        tasks = take(source, len(MALFORMED) + 1)
    assert [t["task_id"] for t in tasks] == [f"tasks.jsonl:{2 * i + 1}" for i in range(len(MALFORMED) + 1)]
    assert source.skipped == len(MALFORMED)
    for k, ((_, message), problem) in enumerate(zip(MALFORMED, source.problems)):
        assert problem.startswith(f"{path}:{2 * k + 2}: "), problem
        assert re.search(message, problem), (message, problem)
    assert [r.getMessage().split("record: ", 1)[1] for r in caplog.records] == source.problems
    take(source, 2 * len(MALFORMED))  # the next epochs skip the same lines without counting them again
    assert source.skipped == len(MALFORMED)


def test_auto_schema_skips_records_of_the_other_kind_and_blank_lines(tmp_path):
    path = write_jsonl(tmp_path / "mixed.jsonl", ["", {"problem": "1+1?", "answer": "2"}, GOOD, "   "])
    source = jsonl_tasks(path, shuffle=False)
    assert source.schema == "math"
    assert take(source, 2) == [{"task_id": "mixed.jsonl:2", "prompt": "1+1?", "answer": "2"}] * 2
    assert source.skipped == 1 and "mixed.jsonl:3: missing 'answer'" in source.problems[0]


def test_missing_file_empty_file_and_no_valid_record_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"task file .*nope\.jsonl does not exist"):
        jsonl_tasks(tmp_path / "nope.jsonl")
    with pytest.raises(ConfigError, match=r"empty\.jsonl: the task file has no records"):
        jsonl_tasks(write_jsonl(tmp_path / "empty.jsonl", ["", ""]))
    bad = write_jsonl(tmp_path / "bad.jsonl", ["{", {"prompt": "p"}])
    with pytest.raises(ConfigError, match=r"bad\.jsonl: no valid task record in 2 lines(.|\n)*:2: not a task"):
        jsonl_tasks(bad)
    with pytest.raises(ConfigError, match="schema must be"):
        jsonl_tasks(bad, schema="sql")  # type: ignore[arg-type]


def numbered(tmp_path: Path, n: int, name: str = "n.jsonl") -> Path:
    return write_jsonl(tmp_path / name, [{"task_id": str(i), "problem": f"{i}+0?", "answer": str(i)}
                                         for i in range(n)])


def ids(tasks: list[dict]) -> list[int]:
    return [int(t["task_id"]) for t in tasks]


def test_shuffle_is_a_permutation_per_epoch_fixed_by_seed_and_new_each_epoch(tmp_path):
    path = numbered(tmp_path, 40)
    first = ids(take(jsonl_tasks(path, seed=3, shuffle_buffer=8), 120))
    assert first == ids(take(jsonl_tasks(path, seed=3, shuffle_buffer=8), 120))
    assert first != ids(take(jsonl_tasks(path, seed=4, shuffle_buffer=8), 120))
    epochs = [first[0:40], first[40:80], first[80:120]]
    assert all(sorted(e) == list(range(40)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3 and epochs[0] != list(range(40))
    assert ids(take(jsonl_tasks(path, shuffle=False), 80)) == list(range(40)) * 2


@settings(max_examples=25, deadline=None)
@given(k=st.integers(0, 75), buffer=st.sampled_from([1, 4, 16, 64]))
def test_restored_cursor_continues_exactly_like_an_uninterrupted_run(tmp_path_factory, k, buffer):
    path = numbered(tmp_path_factory.getbasetemp(), 30, "resume.jsonl")
    uninterrupted = take(jsonl_tasks(path, seed=1, shuffle_buffer=buffer), k + 20)
    source = jsonl_tasks(path, seed=1, shuffle_buffer=buffer)
    assert take(source, k) == uninterrupted[:k]
    state = json.loads(json.dumps(source.state()))  # as a checkpoint stores it
    resumed = jsonl_tasks(path, seed=1, shuffle_buffer=buffer)
    resumed.restore(state)
    assert take(resumed, 20) == uninterrupted[k:]


def test_restore_refuses_a_cursor_from_another_file_or_seed(tmp_path):
    source = jsonl_tasks(numbered(tmp_path, 10), seed=1)
    take(source, 3)
    with pytest.raises(ConfigError, match="different file or settings"):
        jsonl_tasks(numbered(tmp_path, 11, "other.jsonl"), seed=1).restore(source.state())
    with pytest.raises(ConfigError, match="different file or settings"):
        jsonl_tasks(tmp_path / "n.jsonl", seed=2).restore(source.state())


def test_a_large_file_streams_through_a_bounded_buffer(tmp_path):
    n = 50_000
    path = tmp_path / "big.jsonl"
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"task_id": str(i), "problem": f"What is {i} plus zero? " + "x" * 150,
                                "answer": str(i)}) + "\n")
    size = path.stat().st_size
    source = jsonl_tasks(path, seed=0, shuffle_buffer=256)
    count = total = squares = 0
    tracemalloc.start()
    try:
        for task in itertools.islice(source, n):
            i = int(task["task_id"])
            count, total, squares = count + 1, total + i, squares + i * i
            assert len(source._buffer) <= 256
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # one epoch is a permutation of every record (same count, sum and sum of squares as 0..n-1)
    assert (count, total, squares) == (n, sum(range(n)), sum(i * i for i in range(n)))
    assert size > 9_000_000 and peak < 1_500_000, (size, peak)  # the buffer, never the file

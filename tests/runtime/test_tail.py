"""JsonlTail reads what a writer appended since the last call: whole lines only, across a rotation, and says when
the file was replaced."""

from __future__ import annotations

import json

from areal.runtime.records.tail import JsonlTail


def _append(path, *objects, end="\n"):
    with path.open("a") as file:
        file.write("".join(json.dumps(o) + "\n" for o in objects[:-1]) + json.dumps(objects[-1]) + end)


def test_a_line_being_written_waits_for_its_newline(tmp_path):
    path = tmp_path / "x.jsonl"
    tail = JsonlTail(path)
    assert tail.read() == []  # no file yet
    _append(path, {"a": 1}, {"b": 2}, end="")  # the second line has no newline yet
    assert tail.read() == [{"a": 1}]
    with path.open("a") as file:
        file.write("\n")
    assert tail.read() == [{"b": 2}]
    assert tail.read() == []


def test_a_torn_line_is_skipped_and_the_lines_around_it_stand(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n{"b": \n[1, 2]\n{"c": 3}\n')
    assert JsonlTail(path).read() == [{"a": 1}, {"c": 3}]


def test_a_rotated_file_is_finished_under_its_new_name_before_the_new_one(tmp_path):
    path, old = tmp_path / "w.jsonl", tmp_path / "w.old.jsonl"
    tail = JsonlTail(path, old)
    _append(path, {"n": 1})
    assert tail.read() == [{"n": 1}]
    _append(path, {"n": 2})
    path.replace(old)  # the writer rotates, then goes on in a new file
    _append(path, {"n": 3})
    assert tail.read() == [{"n": 2}, {"n": 3}]
    assert not tail.reset


def test_a_late_reader_starts_with_the_rotated_half(tmp_path):
    path, old = tmp_path / "w.jsonl", tmp_path / "w.old.jsonl"
    _append(old, {"n": 1}, {"n": 2})
    _append(path, {"n": 3})
    assert JsonlTail(path, old).read() == [{"n": 1}, {"n": 2}, {"n": 3}]


def test_a_replaced_file_starts_over_and_says_so(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = JsonlTail(path)
    _append(path, {"n": 1}, {"n": 2})
    assert len(tail.read()) == 2
    tmp = tmp_path / "metrics.tmp"  # a resume keeps the lines its checkpoint had seen, by rename
    _append(tmp, {"n": 1})
    tmp.replace(path)
    assert tail.read() == [{"n": 1}] and tail.reset
    _append(path, {"n": 5})
    assert tail.read() == [{"n": 5}] and not tail.reset

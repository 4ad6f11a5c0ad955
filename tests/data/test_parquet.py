"""Parquet task files (the `data` extra): the same tasks as the same records in JSONL, streamed across row groups,
shuffled per epoch and resumed exactly; what goes wrong is named."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal import RunConfig
from areal.data import TaskFileSource, code_tasks, math_tasks
from areal.data.jsonl import jsonl_tasks
from areal.data.parquet import parquet_tasks
from areal.errors import ConfigError
from tests.data.test_jsonl import ids, take, write_jsonl
from tests.data.test_verl_layout import verl_row

pytestmark = pytest.mark.data
pa = pytest.importorskip("pyarrow", reason="the 'data' extra")
pq = pytest.importorskip("pyarrow.parquet", reason="the 'data' extra")


def write_parquet(path, rows: list[dict], row_group_size: int | None = None):
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def numbered_rows(n: int) -> list[dict]:
    return [{"task_id": str(i), "problem": f"{i}+0?", "answer": str(i)} for i in range(n)]


def test_verl_rows_read_from_parquet_are_the_tasks_the_same_records_make_in_jsonl(tmp_path):
    tests = json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})
    for name, rows in (("math", [verl_row(str(i)) for i in range(5)]), ("code", [verl_row(tests, "code")] * 3)):
        table = parquet_tasks(write_parquet(tmp_path / f"{name}.parquet", rows), shuffle=False)
        lines = jsonl_tasks(write_jsonl(tmp_path / f"{name}.jsonl", rows), shuffle=False)
        assert table.schema == lines.schema == name
        from_parquet, from_jsonl = take(table, 2 * len(rows)), take(lines, 2 * len(rows))
        assert [t["task_id"] for t in from_parquet[:2]] == [f"{name}.parquet:1", f"{name}.parquet:2"]
        for task in (*from_parquet, *from_jsonl):
            task.pop("task_id")
        assert from_parquet == from_jsonl


def test_rows_stream_across_row_groups_one_permutation_per_epoch_fixed_by_seed(tmp_path):
    path = write_parquet(tmp_path / "n.parquet", numbered_rows(40), row_group_size=7)
    first = ids(take(parquet_tasks(path, seed=3, shuffle_buffer=8), 120))
    assert first == ids(take(parquet_tasks(path, seed=3, shuffle_buffer=8), 120))
    assert first != ids(take(parquet_tasks(path, seed=4, shuffle_buffer=8), 120))
    assert all(sorted(first[e:e + 40]) == list(range(40)) for e in (0, 40, 80)) and first[:40] != list(range(40))
    assert ids(take(parquet_tasks(path, shuffle=False), 80)) == list(range(40)) * 2


@settings(max_examples=20, deadline=None)
@given(k=st.integers(0, 75), buffer=st.sampled_from([1, 4, 16, 64]), groups=st.sampled_from([3, 7, 100]))
def test_a_restored_cursor_continues_exactly_like_an_uninterrupted_run(tmp_path_factory, k, buffer, groups):
    path = write_parquet(tmp_path_factory.getbasetemp() / f"resume{groups}.parquet", numbered_rows(30), groups)
    uninterrupted = take(parquet_tasks(path, seed=1, shuffle_buffer=buffer), k + 20)
    source = parquet_tasks(path, seed=1, shuffle_buffer=buffer)
    assert take(source, k) == uninterrupted[:k]
    resumed = parquet_tasks(path, seed=1, shuffle_buffer=buffer)
    resumed.restore(json.loads(json.dumps(source.state())))
    assert take(resumed, 20) == uninterrupted[k:]


def test_bad_rows_are_skipped_by_row_number_and_a_file_that_is_not_parquet_is_named(tmp_path):
    rows = [{"problem": "1+1?", "answer": "2"}, {"problem": "", "answer": "3"}, {"problem": "2+2?", "answer": "4"}]
    source = parquet_tasks(write_parquet(tmp_path / "rows.parquet", rows), shuffle=False)
    assert [t["task_id"] for t in take(source, 2)] == ["rows.parquet:1", "rows.parquet:3"]
    assert source.skipped == 1 and source.problems[0].endswith("rows.parquet:2: 'problem' is empty "
                                                               "(a math task needs a problem and an answer)")
    fake = tmp_path / "fake.parquet"
    fake.write_text('{"problem": "1+1?", "answer": "2"}\n')
    with pytest.raises(ConfigError, match=r"parquet_tasks: .*fake\.parquet is not a readable Parquet file"):
        parquet_tasks(fake)
    empty = write_parquet(tmp_path / "empty.parquet", [])
    with pytest.raises(ConfigError, match=r"empty\.parquet: the task file has no records$"):
        parquet_tasks(empty)
    with pytest.raises(ConfigError, match=r"no valid task record in 3 rows"):
        parquet_tasks(write_parquet(tmp_path / "code.parquet", rows), schema="code")


def test_a_parquet_data_path_is_read_as_parquet_by_the_config_chosen_sources(tmp_path):
    path = write_parquet(tmp_path / "train.parquet", [verl_row("72"), verl_row("9")])
    config = RunConfig(data={"path": str(path), "heldout_path": str(path)})
    for split in ("train", "test"):
        source = math_tasks(split).configure(config)
        assert isinstance(source, TaskFileSource) and repr(source).startswith("parquet_tasks(")
        assert sorted(t["answer"] for t in take(source, 2)) == ["72", "9"]
    with pytest.raises(ConfigError, match=r"^data\.path: .*train\.parquet: no valid task record in 2 rows "
                                          r"\(schema='code'\)"):
        code_tasks("train").configure(config)


def test_a_file_of_many_row_groups_streams_without_holding_the_table(tmp_path):
    rows = [{"task_id": str(i), "problem": f"What is {i} plus zero? " + "x" * 150, "answer": str(i)}
            for i in range(50_000)]
    table = pa.Table.from_pylist(rows)
    whole = table.nbytes
    pq.write_table(table, tmp_path / "big.parquet", row_group_size=5_000)
    del table
    source = parquet_tasks(tmp_path / "big.parquet", shuffle_buffer=256)
    seen, peak = set(), 0
    for task in take(source, 50_000):
        seen.add(task["task_id"])
        peak = max(peak, pa.total_allocated_bytes())
    assert len(seen) == 50_000  # one epoch: every row once
    assert peak < whole / 2, (peak, whole)  # pyarrow holds a row group's worth, not the file's

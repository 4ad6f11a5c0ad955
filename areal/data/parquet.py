"""Task sources read from Parquet files, the form public RL sets and verl's preprocessed data come in.

A record's position is its row index. Rows are read a batch at a time with pyarrow (the `data` extra),
which holds one row group's columns, never the whole table unless it is one group; nested columns (a
`prompt` of chat messages, verl's `reward_model` struct) arrive as Python lists and dicts for `schemas.py`.
The streaming, shuffling and cursor are `task_file.py`'s.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from areal.data.schemas import ChatTemplate, RecordError
from areal.data.task_file import TaskFileSource, checked_task_file
from areal.errors import ConfigError

MISSING_PYARROW = "parquet_tasks needs the 'pyarrow' package: pip install -c constraints.txt -e '.[data]'"
BATCH_ROWS = 256


def _parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(MISSING_PYARROW) from None
    return pq


class ParquetRecords:
    """The rows of a Parquet file as dicts, each at its row index; the file is opened per read."""

    kind = "Parquet"

    def __init__(self, path: Path) -> None:
        self.path = path
        pq = _parquet()
        try:
            metadata = pq.read_metadata(path)
        except Exception as exc:  # pyarrow raises its own error types for a file that is not Parquet
            raise ConfigError(f"parquet_tasks: {path} is not a readable Parquet file: {exc}") from None
        sizes = [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
        self._group_starts = [sum(sizes[:g]) for g in range(len(sizes))]
        self.rows = sum(sizes)

    def records(self, start: int) -> Iterator[tuple[int, int, dict[str, Any]]]:
        if start >= self.rows:
            return
        group = bisect.bisect_right(self._group_starts, start) - 1
        groups = list(range(group, len(self._group_starts)))
        row = self._group_starts[group]
        with _parquet().ParquetFile(self.path) as table:
            for batch in table.iter_batches(batch_size=BATCH_ROWS, row_groups=groups):
                end = row + batch.num_rows
                if end > start:
                    skip = max(0, start - row)
                    for index, record in enumerate(batch.slice(skip).to_pylist(), start=row + skip):
                        yield index, index + 1, record
                row = end

    def records_at(self, positions: Sequence[int]) -> list[dict[str, Any]]:
        found: dict[int, dict[str, Any]] = {}
        with _parquet().ParquetFile(self.path) as table:
            for group in sorted({bisect.bisect_right(self._group_starts, p) - 1 for p in positions}):
                rows = table.read_row_group(group)
                first = self._group_starts[group]
                for position in positions:
                    if first <= position < first + rows.num_rows:
                        found[position] = rows.slice(position - first, 1).to_pylist()[0]
        return [found.get(position, {}) for position in positions]

    def decode(self, raw: dict[str, Any]) -> Any:
        if not isinstance(raw, dict):
            raise RecordError(f"a row must be a record of columns, got {type(raw).__name__}")
        return raw


def parquet_tasks(
    path: str | Path,
    *,
    schema: Literal["code", "math", "auto"] = "auto",
    seed: int = 0,
    shuffle: bool = True,
    shuffle_buffer: int = 1024,
    chat_template: ChatTemplate | None = None,
) -> TaskFileSource:
    """Tasks from a Parquet file, one per row, with `jsonl_tasks`' columns and options (docs/data.md), verl's
    layout included (`prompt` as chat messages, `reward_model.ground_truth`); needs the `data` extra (pyarrow)."""
    path = checked_task_file("parquet_tasks", path, schema, shuffle_buffer, ".parquet")
    return TaskFileSource(ParquetRecords(path), schema, seed, shuffle, shuffle_buffer, chat_template,
                          "parquet_tasks")

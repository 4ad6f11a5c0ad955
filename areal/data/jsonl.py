"""Task sources read from JSONL files: one JSON record per line, a record's position its byte offset.

The streaming, shuffling and cursor are `task_file.py`'s; this module reads lines and decodes them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from areal.data.schemas import ChatTemplate, RecordError
from areal.data.task_file import TaskFileSource, checked_task_file
from areal.errors import ConfigError

PARQUET_MAGIC = b"PAR1"


class JsonlRecords:
    """The lines of a JSONL file, each at its byte offset; the file stays open only while a read lives."""

    kind = "JSONL"

    def __init__(self, path: Path) -> None:
        self.path = path

    def records(self, start: int) -> Iterator[tuple[int, int, bytes]]:
        with open(self.path, "rb") as f:
            f.seek(start)
            offset = start
            for raw in f:
                yield offset, offset + len(raw), raw
                offset += len(raw)

    def records_at(self, positions: Sequence[int]) -> list[bytes]:
        with open(self.path, "rb") as f:
            lines = []
            for offset in positions:
                f.seek(offset)
                lines.append(f.readline())
            return lines

    def decode(self, raw: bytes) -> Any:
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except UnicodeDecodeError:
            raise RecordError("the line is not UTF-8") from None
        except RecursionError:
            raise RecordError("the JSON is nested too deeply to read") from None
        except ValueError as exc:
            raise RecordError(f"bad JSON: {exc}") from None


def jsonl_tasks(
    path: str | Path,
    *,
    schema: Literal["code", "math", "auto"] = "auto",
    seed: int = 0,
    shuffle: bool = True,
    shuffle_buffer: int = 1024,
    chat_template: ChatTemplate | None = None,
) -> TaskFileSource:
    """Tasks from a JSONL file (layouts in docs/data.md); "auto" takes the schema of the first valid record.

    A record's chat `messages` stay the task's prompt as a list, which a run's generator renders in its model's
    chat template (roles kept); `chat_template` renders them into text here instead, e.g.
    `lambda m: tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True)`.
    """
    path = checked_task_file("jsonl_tasks", path, schema, shuffle_buffer, ".jsonl")
    with open(path, "rb") as f:
        if f.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC:
            raise ConfigError(f"jsonl_tasks: {path} is a Parquet file, not JSONL; read it with parquet_tasks(path) "
                              "(or name it in data.path with a .parquet suffix)")
    return TaskFileSource(JsonlRecords(path), schema, seed, shuffle, shuffle_buffer, chat_template, "jsonl_tasks")

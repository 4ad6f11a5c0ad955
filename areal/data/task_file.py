"""Task sources read from a file of records, streamed, shuffled through a bounded buffer, resumable.

The file is read record by record and never held whole: at most `shuffle_buffer` parsed tasks sit
in memory. Each draw takes buffer slot `hash(seed, epoch, draw) % len(buffer)` and refills it
from the next record, so the order depends only on (seed, epoch) and the cursor needs no RNG
state: it is the read position, the draw count and the positions of the tasks in the buffer.
Reading past the end starts the next epoch in a new order.

A malformed record (bad JSON, a missing field, a wrong type) is skipped, counted and logged with
its file:line (file:row for a table); it never stops the stream. What a position is and how a
record is decoded is the reader's (`jsonl.py`, `parquet.py`); record layouts live in `schemas.py`.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from areal.data.schemas import FIELDS, ChatTemplate, RecordError, Task, detect_schema, parse_record
from areal.errors import ConfigError

log = logging.getLogger(__name__)

MAX_PROBLEMS = 100  # messages kept; `skipped` counts every one
SCHEMA_CHOICES = ("code", "math", "auto")
_FINGERPRINT_BYTES = 1 << 16

_Entry = tuple[int, int, Task]  # (position, record number, task)


class RecordReader(Protocol):
    """One file's records in order, each at a position a later reader of the same file can seek to."""

    path: Path
    kind: str  # what the file is, for messages: "JSONL", "Parquet"

    def records(self, start: int) -> Iterator[tuple[int, int, Any]]:
        """(position, next position, raw record) from position `start` on."""

    def records_at(self, positions: Sequence[int]) -> list[Any]:
        """The raw records at `positions`, in that order."""

    def decode(self, raw: Any) -> Any:
        """The record as a JSON-like value; None for a blank one; RecordError when it is unreadable."""


class TaskFileSource:
    """A never-ending stream of tasks from one file of records, epoch after epoch.

    `fields` names the keys of every task it yields; `skipped` and `problems` report the
    malformed records of the first pass (later epochs skip the same records silently).
    """

    def __init__(self, reader: RecordReader, schema: str, seed: int, shuffle: bool, shuffle_buffer: int,
                 chat_template: ChatTemplate | None, name: str) -> None:
        self.reader = reader
        self.path = reader.path
        self.seed = seed
        self.capacity = shuffle_buffer if shuffle else 1
        self.chat_template = chat_template
        self._name = name
        self.schema = self._resolve_schema(schema)
        self.fields: tuple[str, ...] = FIELDS[self.schema]
        self.skipped = 0
        self.problems: list[str] = []
        self._fingerprint = _fingerprint(self.path)
        self._epoch = 0
        self._drawn = 0  # draws in this epoch
        self._read_position = 0  # position of the next record to read
        self._read_count = 0  # number of the last record read (1-based)
        self._buffer: list[_Entry] = []
        self._records: Iterator[tuple[int, int, Any]] | None = None

    def __repr__(self) -> str:
        return f"{self._name}({str(self.path)!r}, schema={self.schema!r}, seed={self.seed})"

    @property
    def epoch(self) -> int:
        """Passes over the tasks begun so far, minus one: it grows with the first task of each new pass."""
        return self._epoch

    def __iter__(self) -> Iterator[Task]:
        return self

    def __next__(self) -> Task:
        self._top_up()
        if not self._buffer:
            if self._drawn == 0:
                raise ConfigError(f"{self.path}: no valid task records left; was the file changed while in use?")
            self._epoch, self._drawn = self._epoch + 1, 0
            self._read_position, self._read_count, self._records = 0, 0, None
            self._top_up()
        slot = self._slot(len(self._buffer))
        task = self._buffer[slot][2]
        self._buffer[slot] = self._buffer[-1]
        self._buffer.pop()
        self._drawn += 1
        return task

    # -- reading --------------------------------------------------------------------------

    def _slot(self, n: int) -> int:
        if n == 1:
            return 0
        key = f"{self.seed}:{self._epoch}:{self._drawn}".encode()
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % n

    def _top_up(self) -> None:
        """Fill the buffer to capacity, or until the file ends."""
        if self._records is None:
            self._records = self.reader.records(self._read_position)
        while len(self._buffer) < self.capacity:
            item = next(self._records, None)
            if item is None:
                return
            position, self._read_position, raw = item
            self._read_count += 1
            task = self._parse(raw, self._read_count, report=self._epoch == 0)
            if task is not None:
                self._buffer.append((position, self._read_count, task))

    def _parse(self, raw: Any, number: int, *, report: bool) -> Task | None:
        try:
            return self._decode(raw, number, self.schema)
        except RecordError as exc:
            if report:
                self._report(f"{self.path}:{number}: {exc}")
            return None

    def _decode(self, raw: Any, number: int, schema: str | None) -> Task | None:
        record = self.reader.decode(raw)
        if record is None:
            return None
        if schema is None:
            schema = detect_schema(record)
            if schema is None:
                raise RecordError("not a task: no code fields ('inputs'/'outputs'/'input_output') "
                                  "and no math fields ('answer'/'solution'/'reward_model')")
        return parse_record(record, schema, f"{self.path.name}:{number}", self.chat_template)

    def _report(self, message: str) -> None:
        self.skipped += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(message)
        log.warning("skipping a task record: %s", message)

    def _resolve_schema(self, schema: str) -> str:
        """The schema of the first valid record (one pass at most, stopping there)."""
        problems: list[str] = []
        count = 0
        for count, (_, _, raw) in enumerate(self.reader.records(0), start=1):
            try:
                task = self._decode(raw, count, None if schema == "auto" else schema)
            except RecordError as exc:
                problems.append(f"{self.path}:{count}: {exc}")
                continue
            if task is None:
                continue
            if schema != "auto":
                return schema
            found = detect_schema(self.reader.decode(raw))
            assert found is not None  # _decode parsed it under that schema
            return found
        if not problems:
            blank = f" ({count} {self._unit}, all blank)" if count else ""
            raise ConfigError(f"{self.path}: the task file has no records{blank}")
        shown = "\n  ".join(problems[:5])
        raise ConfigError(f"{self.path}: no valid task record in {count} {self._unit} "
                          f"(schema={schema!r}); the first problems:\n  {shown}")

    @property
    def _unit(self) -> str:
        return "lines" if self.reader.kind == "JSONL" else "rows"

    # -- the cursor -----------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The cursor as plain JSON-able values: the next `next()` after `restore` matches this one's."""
        return {
            "path": str(self.path),
            "fingerprint": self._fingerprint,
            "schema": self.schema,
            "seed": self.seed,
            "capacity": self.capacity,
            "epoch": self._epoch,
            "drawn": self._drawn,
            "read_offset": self._read_position,  # the keys cursors saved before Parquet sources kept
            "read_line": self._read_count,
            "buffer": [[position, number] for position, number, _ in self._buffer],
            "skipped": self.skipped,
            "problems": list(self.problems),
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a cursor that `state()` of a source over the same file and settings returned."""
        mine = (self._fingerprint, self.schema, self.seed, self.capacity)
        theirs = tuple(state.get(k) for k in ("fingerprint", "schema", "seed", "capacity"))
        if mine != theirs:
            raise ConfigError(
                f"{self.path}: the task cursor (fingerprint, schema, seed, buffer) = {theirs} was saved from a "
                f"different file or settings than this source's {mine}; resume with the same file, seed, "
                "schema and shuffle settings."
            )
        entries = [(int(position), int(number)) for position, number in state["buffer"]]
        raws = self.reader.records_at([position for position, _ in entries])
        buffer: list[_Entry] = []
        for (position, number), raw in zip(entries, raws):
            try:
                task = self._decode(raw, number, self.schema)
            except RecordError as exc:
                task, why = None, str(exc)
            else:
                why = "it is blank"
            if task is None:
                raise ConfigError(f"{self.path}:{number}: the task cursor points at a record that no longer "
                                  f"parses ({why}); was the file edited since the checkpoint?")
            buffer.append((position, number, task))
        self._epoch, self._drawn = int(state["epoch"]), int(state["drawn"])
        self._read_position, self._read_count = int(state["read_offset"]), int(state["read_line"])
        self._buffer, self._records = buffer, None
        self.skipped, self.problems = int(state["skipped"]), list(state["problems"])


def _fingerprint(path: Path) -> str:
    """Size plus a hash of the head and tail: cheap on a large file, and survives a copy to another machine."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        digest.update(f.read(_FINGERPRINT_BYTES))
        f.seek(max(0, size - _FINGERPRINT_BYTES))
        digest.update(f.read(_FINGERPRINT_BYTES))
    return digest.hexdigest()[:16]


def checked_task_file(caller: str, path: str | Path, schema: str, shuffle_buffer: Any, suffixes: str) -> Path:
    """`path` as a Path once the options every task-file source shares are valid, else a ConfigError naming them."""
    path = Path(path)
    if schema not in SCHEMA_CHOICES:
        raise ConfigError(f"{caller}: schema must be 'code', 'math' or 'auto', got {schema!r}")
    if isinstance(shuffle_buffer, bool) or not isinstance(shuffle_buffer, int) or shuffle_buffer < 1:
        raise ConfigError(f"{caller}: shuffle_buffer must be an integer >= 1, got {shuffle_buffer!r}")
    if not path.is_file():
        why = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise ConfigError(f"{caller}: task file {path} {why} (cwd: {Path.cwd()}); pass the path of a {suffixes} file")
    return path

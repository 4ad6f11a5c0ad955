"""Task sources read from JSONL files, streamed, shuffled through a bounded buffer, resumable.

The file is read line by line and never held whole: at most `shuffle_buffer` parsed tasks sit
in memory. Each draw takes buffer slot `hash(seed, epoch, draw) % len(buffer)` and refills it
from the next line, so the order depends only on (seed, epoch) and the cursor needs no RNG
state: it is the read offset, the draw count and the byte offsets of the tasks in the buffer.
Reading past the end starts the next epoch in a new order.

A malformed record (bad JSON, a missing field, a wrong type) is skipped, counted and logged with
its file:line; it never stops the stream. Record layouts live in `schemas.py`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from areal.data.schemas import FIELDS, ChatTemplate, RecordError, Task, detect_schema, parse_record
from areal.errors import ConfigError

log = logging.getLogger(__name__)

MAX_PROBLEMS = 100  # messages kept; `skipped` counts every one
_FINGERPRINT_BYTES = 1 << 16

_Entry = tuple[int, int, Task]  # (byte offset, line number, task)


class JsonlTaskSource:
    """A never-ending stream of tasks from one JSONL file, epoch after epoch.

    `fields` names the keys of every task it yields; `skipped` and `problems` report the
    malformed records of the first pass (later epochs skip the same lines silently).
    """

    def __init__(self, path: Path, schema: str, seed: int, shuffle: bool, shuffle_buffer: int,
                 chat_template: ChatTemplate | None) -> None:
        self.path = path
        self.seed = seed
        self.capacity = shuffle_buffer if shuffle else 1
        self.chat_template = chat_template
        self.schema = self._resolve_schema(schema)
        self.fields: tuple[str, ...] = FIELDS[self.schema]
        self.skipped = 0
        self.problems: list[str] = []
        self._fingerprint = _fingerprint(path)
        self._epoch = 0
        self._drawn = 0  # draws in this epoch
        self._read_offset = 0  # byte offset of the next line to read
        self._read_line = 0  # number of the last line read (1-based)
        self._buffer: list[_Entry] = []
        self._lines: Iterator[tuple[int, bytes]] | None = None

    def __repr__(self) -> str:
        return f"jsonl_tasks({str(self.path)!r}, schema={self.schema!r}, seed={self.seed})"

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
            self._read_offset, self._read_line, self._lines = 0, 0, None
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
        if self._lines is None:
            self._lines = _read_lines(self.path, self._read_offset)
        while len(self._buffer) < self.capacity:
            item = next(self._lines, None)
            if item is None:
                return
            offset, raw = item
            self._read_offset, self._read_line = offset + len(raw), self._read_line + 1
            task = self._parse(raw, self._read_line, report=self._epoch == 0)
            if task is not None:
                self._buffer.append((offset, self._read_line, task))

    def _parse(self, raw: bytes, line: int, *, report: bool) -> Task | None:
        if not raw.strip():
            return None
        try:
            return self._decode(raw, line, self.schema)
        except RecordError as exc:
            if report:
                self._report(f"{self.path}:{line}: {exc}")
            return None

    def _decode(self, raw: bytes, line: int, schema: str | None) -> Task:
        try:
            record = json.loads(raw)
        except UnicodeDecodeError:
            raise RecordError("the line is not UTF-8") from None
        except RecursionError:
            raise RecordError("the JSON is nested too deeply to read") from None
        except ValueError as exc:
            raise RecordError(f"bad JSON: {exc}") from None
        if schema is None:
            schema = detect_schema(record)
            if schema is None:
                raise RecordError("not a task: no code fields ('inputs'/'outputs'/'input_output') "
                                  "and no math fields ('answer'/'solution')")
        return parse_record(record, schema, f"{self.path.name}:{line}", self.chat_template)

    def _report(self, message: str) -> None:
        self.skipped += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(message)
        log.warning("skipping a task record: %s", message)

    def _resolve_schema(self, schema: str) -> str:
        """The schema of the first valid record (one pass at most, stopping there)."""
        problems: list[str] = []
        lines = 0
        for line, (_, raw) in enumerate(_read_lines(self.path, 0), start=1):
            lines = line
            if not raw.strip():
                continue
            try:
                self._decode(raw, line, None if schema == "auto" else schema)
            except RecordError as exc:
                problems.append(f"{self.path}:{line}: {exc}")
                continue
            if schema != "auto":
                return schema
            found = detect_schema(json.loads(raw))
            assert found is not None  # _decode parsed it under that schema
            return found
        if not problems:
            raise ConfigError(f"{self.path}: the task file has no records ({lines} lines, all blank)")
        shown = "\n  ".join(problems[:5])
        raise ConfigError(f"{self.path}: no valid task record in {lines} lines "
                          f"(schema={schema!r}); the first problems:\n  {shown}")

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
            "read_offset": self._read_offset,
            "read_line": self._read_line,
            "buffer": [[offset, line] for offset, line, _ in self._buffer],
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
        buffer: list[_Entry] = []
        with open(self.path, "rb") as f:
            for offset, line in state["buffer"]:
                f.seek(offset)
                try:
                    buffer.append((offset, line, self._decode(f.readline(), line, self.schema)))
                except RecordError as exc:
                    raise ConfigError(f"{self.path}:{line}: the task cursor points at a record that no longer "
                                      f"parses ({exc}); was the file edited since the checkpoint?") from None
        self._epoch, self._drawn = int(state["epoch"]), int(state["drawn"])
        self._read_offset, self._read_line = int(state["read_offset"]), int(state["read_line"])
        self._buffer, self._lines = buffer, None
        self.skipped, self.problems = int(state["skipped"]), list(state["problems"])


def _read_lines(path: Path, offset: int) -> Iterator[tuple[int, bytes]]:
    """(offset, raw line) from `offset` on; the file stays open only while the generator lives."""
    with open(path, "rb") as f:
        f.seek(offset)
        for raw in f:
            yield offset, raw
            offset += len(raw)


def _fingerprint(path: Path) -> str:
    """Size plus a hash of the head and tail: cheap on a large file, and survives a copy to another machine."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        digest.update(f.read(_FINGERPRINT_BYTES))
        f.seek(max(0, size - _FINGERPRINT_BYTES))
        digest.update(f.read(_FINGERPRINT_BYTES))
    return digest.hexdigest()[:16]


def jsonl_tasks(
    path: str | Path,
    *,
    schema: Literal["code", "math", "auto"] = "auto",
    seed: int = 0,
    shuffle: bool = True,
    shuffle_buffer: int = 1024,
    chat_template: ChatTemplate | None = None,
) -> JsonlTaskSource:
    """Tasks from a JSONL file (layouts in docs/data.md); "auto" takes the schema of the first valid record.

    `chat_template` renders a record's `messages` list into the prompt, e.g.
    `lambda m: tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True)`.
    """
    path = Path(path)
    if schema not in ("code", "math", "auto"):
        raise ConfigError(f"jsonl_tasks: schema must be 'code', 'math' or 'auto', got {schema!r}")
    if isinstance(shuffle_buffer, bool) or not isinstance(shuffle_buffer, int) or shuffle_buffer < 1:
        raise ConfigError(f"jsonl_tasks: shuffle_buffer must be an integer >= 1, got {shuffle_buffer!r}")
    if not path.is_file():
        why = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise ConfigError(f"jsonl_tasks: task file {path} {why} (cwd: {Path.cwd()}); pass the path of a .jsonl file")
    return JsonlTaskSource(path, schema, seed, shuffle, shuffle_buffer, chat_template)

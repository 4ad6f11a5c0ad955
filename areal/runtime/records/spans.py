"""Each worker's timed work, appended as it happens: spans/WORKER.jsonl in the run directory.

One line per span: `{"cat": "node", "name": "score", "ts": 1764151200123456, "dur": 5120, "args": {...}}`,
times in microseconds since the epoch. The categories: `decode` (one step of a stream node), `node` (a node's
call on a batch), `weights` (a follower loading a version), `send` (a group onto a channel; long ones are
back-pressure), `publish` and `step` (a trainer's update, from its first node to the published version) and
`wait` (a trainer idle until the group that completes its next step arrives: that group is the straggler).
Times are read from the monotonic clock and offset once to the wall clock, so one worker's spans nest exactly
(a child ends no later than its parent) and the workers of one machine line up.

Writing one costs a json.dumps and a buffered write, a few microseconds. The file is flushed after a long span or
once FLUSH_S has passed, so a reader (`areal view`) sees work within about a second. It is bounded: at half of
`records.spans_max_mb` it is renamed WORKER.old.jsonl (replacing the older one) and a new file starts, so a long
run keeps its newest spans. A write that fails stops the recording with one warning in the worker's log and
never reaches the worker's loop: a trace is never worth a run. `areal trace` turns the files into a Perfetto
trace (runtime/records/trace.py).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from areal.config import RecordsConfig
from areal.graph.meta import GroupMeta

FOLDER = "spans"
ROTATED = ".old.jsonl"
FLUSH_S = 0.5
LONG_SPAN_S = 0.05  # a span this long is flushed at once: it is rare, and a reader wants it

log = logging.getLogger("areal.worker")


def span_files(run_dir: str | Path, worker: str) -> tuple[Path, Path]:
    """A worker's current span file and its rotated older half."""
    stem = worker.replace("[", "-").replace("]", "")
    folder = Path(run_dir) / FOLDER
    return folder / f"{stem}.jsonl", folder / f"{stem}{ROTATED}"


class Spans:
    def __init__(self, run_dir: str | Path | None, worker: str, settings: RecordsConfig) -> None:
        """`run_dir` None, or `settings.spans` off: a recorder that records nothing."""
        self.path, self.rotated = span_files(run_dir or ".", worker)
        self.half_bytes = int(settings.spans_max_mb * 2**20) // 2
        self._file: IO[str] | None = None
        self._written = 0
        if run_dir is not None and settings.spans:
            self._guarded(self._open)
        self._wall_us = time.time_ns() // 1000  # the wall clock when the monotonic one read `_mono`
        self._mono = time.monotonic()
        self._flushed = self._mono

    def add(self, cat: str, name: str, start: float, end: float, **args: Any) -> None:
        """A span from `start` to `end`, both `time.monotonic()` readings of this process."""
        if self._file is None:
            return
        ts = self._wall_us + int((start - self._mono) * 1e6)
        line = json.dumps({"cat": cat, "name": name, "ts": ts,
                           "dur": self._wall_us + int((end - self._mono) * 1e6) - ts, "args": args}) + "\n"
        self._guarded(self._write, line, end - start >= LONG_SPAN_S or end - self._flushed >= FLUSH_S, end)

    @contextmanager
    def timed(self, cat: str, name: str, **args: Any) -> Iterator[dict[str, Any]]:
        """A span around the block; the block may add to the dict it gets, which becomes the span's args."""
        start = time.monotonic()
        try:
            yield args
        finally:
            self.add(cat, name, start, time.monotonic(), **args)

    def close(self) -> None:
        if self._file is not None:
            self._guarded(self._file.close)
            self._file = None

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")
        self._written = self.path.stat().st_size

    def _write(self, line: str, flush: bool, now: float) -> None:
        assert self._file is not None
        if self._written + len(line) > self.half_bytes:
            self._file.close()
            self.path.replace(self.rotated)
            self._open()
        self._file.write(line)
        self._written += len(line)
        if flush:
            self._file.flush()
            self._flushed = now

    def _guarded(self, action: Any, *args: Any) -> None:
        try:
            action(*args)
        except OSError as err:
            log.warning("span recording stopped: %s (%s); the run goes on without it", err.strerror or err,
                        err.filename or self.path)
            self._file = None


class StepWait:
    """A trainer's idle time before each step, and the group whose arrival ended it (the step's straggler)."""

    def __init__(self, spans: Spans) -> None:
        self.spans = spans
        self.since = time.monotonic()
        self.arrivals: dict[int, tuple[GroupMeta, float]] = {}  # gathered for coming steps: when each came

    def arrived(self, meta: GroupMeta) -> None:
        self.arrivals[meta.group] = (meta, time.monotonic())

    def ended(self, groups: list[int], version: int, dropped: Sequence[int] = ()) -> None:
        """The step of `groups`, which will publish `version`, starts now; `dropped` groups left untrained."""
        for group in dropped:
            self.arrivals.pop(group, None)
        came = [self.arrivals.pop(g) for g in groups if g in self.arrivals]
        args: dict[str, Any] = {"groups": [groups[0], groups[-1]], "version": version}
        last = max(came, key=lambda item: item[1], default=None)
        if last is not None and last[1] > self.since:  # it came while the trainer was idle: the step waited on it
            args |= {"straggler": last[0].group, "admitted_at": last[0].admitted_at}
        self.spans.add("wait", "wait", self.since, time.monotonic(), **args)

    def restart(self) -> None:
        self.since = time.monotonic()

"""The metrics stream: one JSON object per line, flushed as it is written.

Lines have a "kind": step (one per policy version), eval (held-out pass@1), failed (one per
failed sample, with its reason). The step and eval lines' numbers go to the run's trackers too (trackers.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal.runtime.records.trackers import Tracker, open_trackers
from areal.runtime.storage.rundir import writing

if TYPE_CHECKING:
    from areal.config import RunConfig

log = logging.getLogger("areal.controller")


class MetricsWriter:
    def __init__(self, path: Path, keep_lines: int | None = None, trackers: Sequence[Tracker] = ()) -> None:
        """`keep_lines`: on resume, the lines the checkpoint had seen; later ones describe rolled-back work and go."""
        self.path = path
        with writing(path, path.parent):
            path.parent.mkdir(parents=True, exist_ok=True)
            if keep_lines is not None and path.exists():
                kept = path.read_text().splitlines(keepends=True)[:keep_lines]
                tmp = path.with_suffix(".tmp")
                tmp.write_text("".join(kept))
                tmp.replace(path)
            self.lines = sum(1 for _ in path.open()) if path.exists() else 0
            self._file = path.open("a")
        self.trackers = list(trackers)

    @classmethod
    def for_run(cls, run_dir: Path, config: RunConfig, saved: dict[str, Any] | None, version: int) -> MetricsWriter:
        """A run's metrics.jsonl and trackers; `saved`: a resumed run's checkpoint state, at `version`."""
        keep_lines = int(saved.get("metrics_lines", 0)) if saved else None
        return cls(run_dir / "metrics.jsonl", keep_lines, open_trackers(config, run_dir, version if saved else None))

    def write(self, record: dict[str, Any]) -> None:
        with writing(self.path, self.path.parent):
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        self.lines += 1
        if record.get("kind") in ("step", "eval"):
            self._track(record["kind"], int(record.get("version", 0)), record)

    def _track(self, kind: str, version: int, record: dict[str, Any]) -> None:
        """The record's numbers to each tracker; one that fails is said once and dropped (this file has them)."""
        values = {key: float(value) for key, value in record.items()
                  if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "version"}
        for tracker in list(self.trackers):
            try:
                tracker.log(kind, version, values)
            except Exception as err:  # a tracker's own failure (a network, a disk): the run goes on without it
                log.warning("tracker %s failed (%s: %s); the run goes on without it, metrics.jsonl has every line",
                            type(tracker).__name__, type(err).__name__, err)
                self.trackers.remove(tracker)

    def close(self, failed: bool = False) -> None:
        """Close the file and the trackers (`failed`: the run ended on an error, which a tracker may show); a failure
        here is logged, not raised: every line was flushed as it was written, and an error already on its way (a
        full disk) must not be hidden behind this one."""
        try:
            self._file.close()
        except OSError as err:
            log.warning("closing %s: %s", self.path, err)
        for tracker in self.trackers:
            try:
                tracker.close(failed)
            except Exception as err:
                log.warning("closing tracker %s: %s", type(tracker).__name__, err)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

"""The metrics stream: one JSON object per line, flushed as it is written.

Lines have a "kind": step (one per policy version), eval (held-out pass@1), failed (one per
failed sample, with its reason). TensorBoard scalars are written too when it is installed.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from areal.runtime.storage.rundir import writing

log = logging.getLogger("areal.controller")


class MetricsWriter:
    def __init__(self, path: Path, keep_lines: int | None = None) -> None:
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
        self._board = _tensorboard(path.parent / "tensorboard")

    def write(self, record: dict[str, Any]) -> None:
        with writing(self.path, self.path.parent):
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        self.lines += 1
        if self._board is not None and record.get("kind") in ("step", "eval"):
            step = int(record.get("version", 0))
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "version":
                    self._board.add_scalar(f"{record['kind']}/{key}", value, step)

    def close(self) -> None:
        """Close the files; a failure here is logged, not raised: every line was flushed as it was written, and an
        error already on its way (a full disk) must not be hidden behind this one."""
        try:
            self._file.close()
            if self._board is not None:
                self._board.close()
        except OSError as err:
            log.warning("closing %s: %s", self.path, err)


def _tensorboard(folder: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(folder))


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

"""What happened to each sample, written by the worker it happened in: samples/WORKER.jsonl in the run directory.

One JSON line per sample and event, appended as the event happens, so nothing crosses a socket or waits on
another process for it and a killed run keeps every line written before the kill (a torn last line is
skipped on reading). The lines of a sample, by `sample_id`:

- `{"node": "rollout", "inputs": {"prompt": ...}}`: what the sampling node read (its text inputs);
- `{"node": "score", "outputs": {"reward": 1.0}}`: a node's declared outputs, a per-token one summarised
  (`{"tokens": n, "mean": ...}` for floats, `min`/`max` for integers such as versions);
- `{"node": "controller", "status": "admitted", "version": 4}`: its group passed the staleness gate at version
  4 (written by the controller, so a sample still in flight when a run ends is on record);
- `{"node": "judge", "status": "failed" | "filtered", "reason": ...}`;
- `{"node": "rollout", "status": "dropped", "reason": ..., "tokens": 37}`: the staleness policy dropped it,
  with the tokens it had generated (written by the controller, which every drop is reported to);
- `{"node": "actor", "status": "trained", "step": 7, "version": 5, "lag": 2, "versions": [[5, 3], [6, 9]],
  "loss_mask": [[1, 12]]}`: trained at step 7 (the version it produced) from tokens at least as new as
  version 5; each output token's version and the loss mask the update read, as runs of (value, count), so
  a staleness policy's promise can be checked from the run directory alone.

JSONL and not Parquet: many writers append without coordinating, a line is durable as soon as it is
written, and it reads with `jq` or pandas; Parquet needs pyarrow and buffers a row group a kill loses. A
worker stops at `records.max_mb` with a last line saying so; a re-issued group writes its lines again and
the reader keeps the last. `areal samples RUN_DIR` joins them (runtime/records/sample_records.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from areal.config import RecordsConfig
from areal.graph.batch import Batch, Ragged
from areal.runtime.records.sample_records import FOLDER


class SampleLog:
    def __init__(self, run_dir: str | Path, worker: str, settings: RecordsConfig) -> None:
        folder = Path(run_dir) / FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{worker.replace('[', '-').replace(']', '')}.jsonl"
        self.max_mb, self.max_chars = settings.max_mb, settings.max_chars
        self.max_bytes = int(settings.max_mb * 2**20)
        self._file: IO[str] | None = self.path.open("a", buffering=1)  # line-buffered: a line is written whole
        self._written = self.path.stat().st_size

    def outputs(self, node: str, batch: Batch, fields: Mapping[str, Any]) -> None:
        """One line per row of `batch`: the node's declared outputs for that sample."""
        self._rows(node, batch, "outputs", fields)

    def inputs(self, node: str, batch: Batch, fields: Mapping[str, Any]) -> None:
        """One line per row: what a sampling node read (its prompt)."""
        self._rows(node, batch, "inputs", fields)

    def removed(self, node: str, status: str, sample_ids: Sequence[int], reasons: Sequence[str]) -> None:
        for sid, reason in zip(sample_ids, reasons, strict=True):
            self._write({"sample_id": int(sid), "node": node, "status": status, "reason": self._text(reason)})

    def admitted(self, group: int, samples: int, prompts: int, version: int) -> None:
        """The samples of `prompts` groups from `group` on, `samples` each, admitted at `version`."""
        for sid in range(group * samples, (group + prompts) * samples):
            self._write({"sample_id": sid, "group_id": sid // samples, "node": "controller", "status": "admitted",
                         "version": version})

    def dropped(self, node: str, sample_ids: Sequence[int], tokens: Sequence[int], reason: str) -> None:
        for sid, count in zip(sample_ids, tokens, strict=True):
            self._write({"sample_id": int(sid), "node": node, "status": "dropped", "reason": self._text(reason),
                         "tokens": int(count)})

    def trained(self, node: str, step: int, sample_ids: Sequence[int], versions: Ragged | None,
                loss_mask: Ragged | None) -> None:
        """Samples trained at `step` (the version the update publishes): each output token's version and the loss
        mask the update read (None: the trainer checks no versions; every token in the loss)."""
        version_runs = _row_runs(versions) if versions is not None else None
        mask_runs = _row_runs(loss_mask) if loss_mask is not None else None
        for row, sid in enumerate(sample_ids):
            runs = version_runs[row] if version_runs is not None else []
            oldest = min(value for value, _ in runs) if runs else step - 1
            line = {"sample_id": int(sid), "node": node, "status": "trained", "step": step, "version": oldest,
                    "lag": step - 1 - oldest}
            if version_runs is not None:
                line["versions"] = runs
            if mask_runs is not None:
                line["loss_mask"] = mask_runs[row]
            self._write(line)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _rows(self, node: str, batch: Batch, key: str, fields: Mapping[str, Any]) -> None:
        if not fields or not batch.size:
            return
        columns = {name: self._column(value) for name, value in fields.items()}
        ids, groups = batch["sample_id"].tolist(), batch["group_id"].tolist()
        for row, (sid, gid) in enumerate(zip(ids, groups, strict=True)):
            self._write({"sample_id": int(sid), "group_id": int(gid), "node": node,
                         key: {name: column[row] for name, column in columns.items()}})

    def _column(self, value: Any) -> list[Any]:
        if isinstance(value, Ragged):
            return [_summary(r) for r in value.rows()]
        if isinstance(value, torch.Tensor):
            return [_number(v) for v in value.tolist()]
        return [self._text(v) if isinstance(v, str) else v for v in value]

    def _text(self, value: str) -> str:
        return value if len(value) <= self.max_chars else value[: self.max_chars] + f"… ({len(value)} chars)"

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        line = json.dumps(record, default=str, allow_nan=True) + "\n"
        if self._written + len(line) > self.max_bytes:
            self._file.write(json.dumps({"truncated": f"records.max_mb={self.max_mb:g} reached"}) + "\n")
            self.close()
            return
        self._file.write(line)
        self._written += len(line)


def _row_runs(ragged: Ragged) -> list[list[list[int]]]:
    """Each row of integers as its runs, [[value, count], ...] (a sample's versions change a few times at most),
    found over the packed values at once: a trainer writes a batch's rows every step."""
    values = ragged.values.to(torch.int64).numpy()
    offsets = ragged.offsets.numpy()
    starts = np.ones(len(values), dtype=bool)  # a run starts where the value changes and where a row starts
    starts[1:] = values[1:] != values[:-1]
    starts[offsets[:-1][offsets[:-1] < len(values)]] = True
    first = np.flatnonzero(starts)
    run_values, run_counts = values[first].tolist(), np.diff(first, append=len(values)).tolist()
    bounds = np.searchsorted(first, offsets).tolist()  # row r's runs: those starting in its span
    return [[[run_values[i], run_counts[i]] for i in range(a, b)] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _summary(row: torch.Tensor) -> dict[str, Any]:
    if not len(row):
        return {"tokens": 0}
    if row.dtype.is_floating_point:
        return {"tokens": len(row), "mean": _number(float(row.double().mean()))}
    return {"tokens": len(row), "min": int(row.min()), "max": int(row.max())}


def _number(value: Any) -> Any:
    """A JSON-safe number: NaN and infinities as strings (a failed sample's value is still worth seeing)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, list):
        return [_number(v) for v in value]
    return value

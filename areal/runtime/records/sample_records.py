"""Reading a run's per-sample records (runtime/records/sample_log.py) back: one record per sample, joined by id
across the workers that wrote about it, and filtered the way `areal samples` is asked to."""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal.errors import ConfigError
from areal.runtime.records.tail import JsonlTail

FOLDER = "samples"  # under the run directory; the writer (sample_log.py) imports it from here, torch-free

STATUSES = ("trained", "failed", "filtered", "dropped", "held-out", "pending")
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "<=": operator.le, ">=": operator.ge, "!=": operator.ne, "==": operator.eq, "<": operator.lt, ">": operator.gt,
    "~": lambda value, text: text in str(value),
}
_COLUMNS = ("sample_id", "group_id", "status", "step", "lag", "reason", "node")  # a record's own, beside its fields
_WHERE = re.compile(r"^\s*([\w.\-\[\]]+)\s*(<=|>=|!=|==|<|>|~)\s*(.*?)\s*$")


@dataclass
class SampleRecord:
    sample_id: int
    group_id: int | None = None
    status: str = "pending"  # no verdict yet: in flight, or the run stopped first ("held-out": scored, never trained)
    admitted: int | None = None  # the version its group passed the staleness gate at
    step: int | None = None  # the version the update that trained it published
    lag: int | None = None
    reason: str | None = None  # why it failed, was filtered or dropped, and by which node (`node`)
    node: str | None = None
    versions: list[int] | None = None  # trained: each output token's policy version
    loss_mask: list[int] | None = None  # trained: each output token's loss mask, as the update read it
    dropped_tokens: int | None = None  # dropped: the tokens it had generated
    fields: dict[str, Any] = field(default_factory=dict)  # "node.port" -> value, inputs and outputs alike

    def value(self, name: str) -> Any:
        """A column by name: sample_id, group_id, status, step, lag, reason, node, or a field ("score.reward",
        or a port name when one node alone has it)."""
        if name in _COLUMNS:
            return getattr(self, name)
        if name in self.fields:
            return self.fields[name]
        matches = [v for k, v in self.fields.items() if k.rpartition(".")[2] == name]
        return matches[0] if len(matches) == 1 else None


def read_samples(run_dir: str | Path) -> dict[int, SampleRecord]:
    """Every sample the run's workers wrote about, by id; a later line about the same thing wins."""
    folder = Path(run_dir) / FOLDER
    if not folder.is_dir():
        raise ConfigError(f"{run_dir}: no {FOLDER}/ folder, so no per-sample records ({_why_none(Path(run_dir))})")
    records: dict[int, SampleRecord] = {}
    for path in sorted(folder.glob("*.jsonl")):
        fold(records, JsonlTail(path).read())
    return records


def fold(records: dict[int, SampleRecord], lines: Iterable[dict[str, Any]]) -> None:
    """Apply a worker's lines to the records of the samples they are about (`areal view` folds them as they come)."""
    for line in lines:
        if "sample_id" not in line:
            continue  # the line that says a worker's file was cut at records.max_mb
        sid = int(line["sample_id"])  # a held-out round's samples have negative ids and are never trained
        record = records.setdefault(sid, SampleRecord(sid, status="held-out" if sid < 0 else "pending"))
        _apply(record, line)


def select(records: Iterable[SampleRecord], *, status: str | None = None, step: int | None = None,
           where: Iterable[str] = ()) -> list[SampleRecord]:
    """The records that match every condition, by sample id. `where` holds 'FIELD OP VALUE' conditions
    (OP one of == != < <= > >= and ~, which means 'contains')."""
    if status is not None and status not in STATUSES:
        raise ConfigError(f"--status {status!r}: use one of {', '.join(STATUSES)}")
    records = list(records)
    names = {name for r in records for name in r.fields} if where else set()  # (the view asks at every refresh)
    tests = [_condition(text, names) for text in where]
    chosen = [r for r in records if (status is None or r.status == status) and (step is None or r.step == step)
              and all(test(r) for test in tests)]
    return sorted(chosen, key=lambda r: r.sample_id)


def _apply(record: SampleRecord, line: dict[str, Any]) -> None:
    if line.get("group_id") is not None:
        record.group_id = int(line["group_id"])
    node = line.get("node", "?")
    for key in ("inputs", "outputs"):
        for port, value in (line.get(key) or {}).items():
            record.fields[f"{node}.{port}"] = value
    status = line.get("status")
    if status == "admitted":
        record.admitted = line.get("version")
    elif status == "trained":
        record.status, record.node, record.reason = "trained", node, None
        record.step, record.lag = line.get("step"), line.get("lag")
        record.versions, record.loss_mask = _expanded(line.get("versions")), _expanded(line.get("loss_mask"))
    elif status in ("failed", "filtered", "dropped") and record.status != "trained":
        record.status, record.node, record.reason = status, node, line.get("reason")
        if status == "dropped":
            record.dropped_tokens = line.get("tokens")


def _expanded(runs: list[list[int]] | None) -> list[int] | None:
    """A row written as runs of (value, count) (sample_log.py), one value a token again."""
    return None if runs is None else [value for value, count in runs for _ in range(count)]


def _condition(text: str, names: set[str]) -> Callable[[SampleRecord], bool]:
    """A test of one 'FIELD OP VALUE' condition; a FIELD no sample has, or a port name several nodes have, is an
    error (either would match nothing, silently). `names`: the fields the samples hold ("node.port")."""
    match = _WHERE.match(text)
    if match is None:
        raise ConfigError(f"--where {text!r}: expected FIELD OP VALUE, e.g. 'score.reward<1' or "
                          "'rollout.completion~return' (OP: == != < <= > >= ~)")
    name, op, raw = match.groups()
    if names and name not in _COLUMNS and name not in names:
        owners = sorted(n for n in names if n.rpartition(".")[2] == name)
        if not owners:
            raise ConfigError(f"--where {text!r}: no sample has a field {name!r} (they have: "
                              f"{', '.join(sorted(names | set(_COLUMNS)))})")
        if len(owners) > 1:
            raise ConfigError(f"--where {text!r}: {len(owners)} nodes have a port {name!r} ({', '.join(owners)}): "
                              "name one")
    try:
        wanted: Any = json.loads(raw)
    except json.JSONDecodeError:
        wanted = raw  # a bare word compares as text

    def test(record: SampleRecord) -> bool:
        value = record.value(name)
        if value is None:
            return False
        if isinstance(value, dict):  # a per-token summary compares by its mean, else its length
            value = value.get("mean", value.get("tokens"))
        try:
            return bool(_OPS[op](value, wanted))
        except TypeError:
            return bool(_OPS[op](str(value), str(wanted)))

    return test


def _why_none(run_dir: Path) -> str:
    """The run's own setting where its config says it was off, else the areal that first wrote records."""
    try:
        written = json.loads((run_dir / "config.json").read_text())["records"]["samples"]
    except (OSError, ValueError, KeyError, TypeError):
        written = True
    if written is False:
        return "the run was made with records.samples=false; a run with it true, the default, writes them"
    return "written by runs with records.samples=true, the default, since this areal"

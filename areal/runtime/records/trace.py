"""`areal trace`: a run's spans (runtime/records/spans.py) as one Chrome Trace Event file for Perfetto or chrome://tracing.

Each worker is a process of the trace, named by its id ("rollout[0]", with its pool's nodes) and sorted in the
plan's order, with one track holding its spans as complete ("X") events: times in microseconds from the run's
first span, the span's category and its args (a decode step's running sequences, a node's samples, a weight
load's version, a wait's straggler group). A worker restarted after a crash goes on in the same track. The
trace covers what the span files still hold: each worker's newest `records.spans_max_mb`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from areal.errors import ConfigError
from areal.runtime.compiler.plan import Plan
from areal.runtime.records.spans import FOLDER, span_files
from areal.runtime.records.tail import JsonlTail


def worker_ids(plan: Plan) -> list[str]:
    """Every worker of the run, in the plan's order (the source runs in the controller: it has none)."""
    return [w for pool in plan.pools if pool.role != "source" for w in pool.worker_ids()]


def read_spans(run_dir: Path, plan: Plan) -> dict[str, list[dict[str, Any]]]:
    """Worker id -> its spans, oldest first (the rotated file's, then the current one's)."""
    if not (run_dir / FOLDER).is_dir():
        raise ConfigError(f"{run_dir}: no {FOLDER}/ folder, so no spans to trace (written by runs with "
                          "records.spans=true, the default, since this areal)")
    return {worker: sorted(JsonlTail(*span_files(run_dir, worker)).read(), key=lambda s: s["ts"])
            for worker in worker_ids(plan)}


def chrome_trace(run_dir: Path) -> dict[str, Any]:
    """The trace as a Chrome Trace Event JSON object."""
    plan = Plan.from_json((run_dir / "plan.json").read_text())
    spans = read_spans(run_dir, plan)
    origin = min((s["ts"] for found in spans.values() for s in found), default=0)
    events: list[dict[str, Any]] = []
    for pid, (worker, found) in enumerate(spans.items(), start=1):
        nodes = ", ".join(plan.pool(worker.rpartition("[")[0]).nodes)
        events += [
            {"ph": "M", "name": "process_name", "pid": pid, "tid": pid, "args": {"name": f"{worker}: {nodes}"}},
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": pid, "args": {"sort_index": pid}},
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": pid, "args": {"name": worker}},
        ]
        # a parent before its children: by start, the longer first
        for s in sorted(found, key=lambda s: (s["ts"], -s["dur"])):
            events.append({"ph": "X", "name": s["name"], "cat": s["cat"], "pid": pid, "tid": pid,
                           "ts": s["ts"] - origin, "dur": s["dur"], "args": s.get("args", {})})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"graph": plan.graph, "run_dir": str(run_dir), "origin_unix_us": origin}}


def write_trace(run_dir: Path, out: Path) -> tuple[int, int]:
    """Write the trace to `out`; (workers, spans) it holds."""
    if not (run_dir / "plan.json").is_file():
        raise ConfigError(f"{run_dir}: no plan.json, so not a run directory (areal run writes one as it starts)")
    trace = chrome_trace(run_dir)
    out.write_text(json.dumps(trace))
    spans = sum(1 for e in trace["traceEvents"] if e["ph"] == "X")
    return sum(1 for e in trace["traceEvents"] if e["name"] == "process_name"), spans

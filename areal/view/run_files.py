"""Everything the page shows, read from the run directory alone, a little more at each poll.

plan.json gives the graph's pools and channels and, with the recipe it names (the run's own copy first), the
same picture `areal viz` draws; status.json (runtime/controller/run_status.py) the gate, versions and workers as the
controller last saw them; spans/ what each worker did lately (activity.py); metrics.jsonl the step and held-out
records for the curves; samples/ the per-sample records for the table. Every file is read from where the last
poll stopped (runtime/records/tail.py) and nothing is written, locked or held open, so a run cannot tell whether a view
is watching it, and a finished run reopens from the same files.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Any

from areal.errors import ConfigError
from areal.runtime.compiler.plan import Plan
from areal.runtime.controller.run_status import STATUS
from areal.runtime.records.sample_records import FOLDER as SAMPLES
from areal.runtime.records.sample_records import SampleRecord, fold, select
from areal.runtime.records.tail import JsonlTail
from areal.runtime.storage.resume import RECIPE_COPY
from areal.runtime.storage.rundir import held
from areal.view.activity import WINDOW_S, Activity
from areal.view.axes import chart_axes

CELL_CHARS = 400  # a text field in the samples table is cut here (the whole record: `areal samples --json`)


class RunFiles:
    def __init__(self, run_dir: Path) -> None:
        if not run_dir.is_dir():
            raise ConfigError(f"{run_dir}: no such run directory")
        self.run_dir = run_dir
        self.lock = threading.Lock()  # the server answers on several threads; the tails are read by one at a time
        self.plan: Plan | None = None
        self.activity: Activity | None = None
        self.metrics: list[dict[str, Any]] = []
        self.metrics_epoch = 0  # bumped when metrics.jsonl was replaced (a resume): the page reloads its curves
        self._metrics_tail = JsonlTail(run_dir / "metrics.jsonl")
        self._sample_tails: dict[Path, JsonlTail] = {}
        self.samples: dict[int, SampleRecord] = {}
        self._statuses: deque[dict[str, Any]] = deque()  # the window's status.json snapshots, for rates
        self._svg: str | None = None

    # -- the endpoints ------------------------------------------------------------------

    def plan_info(self) -> dict[str, Any] | None:
        """plan.json as written, with each node's pool; None before the run has written it."""
        with self.lock:
            plan = self._plan()
        if plan is None:
            return None
        return {"plan": asdict(plan), "node_pool": {n: p.name for p in plan.pools for n in p.nodes},
                "run_dir": str(self.run_dir)}

    def graph_svg(self) -> str | None:
        """The picture `areal viz` draws of this run's graph as it runs; None before plan.json exists."""
        with self.lock:
            plan = self._plan()
            if plan is None:
                return None
            if self._svg is None:
                self._svg = _draw(plan, self.run_dir)
            return self._svg

    def live(self) -> dict[str, Any] | None:
        """The page's live numbers (docs/view.md lists them); None before plan.json exists."""
        with self.lock:
            plan = self._plan()
            if plan is None or self.activity is None:
                return None
            status = self._status()
            self.activity.update()
            alive = held(self.run_dir) and (status or {}).get("status") != "stopped"
            # a finished run is shown as it was at its last span: its last seconds of work, not the silence after
            last = self.activity.newest_us / 1e6 or (status or {}).get("written_unix", 0.0)
            as_of = time.time() if alive or not last else last
            since = (status or {}).get("started_unix", 0.0)
            activity = self.activity.summary(int(as_of * 1e6), int(since * 1e6))
            return {"run": {"graph": plan.graph, "run_dir": str(self.run_dir), "alive": alive, "as_of_unix": as_of,
                            "mode": plan.mode, "eta": plan.staleness,
                            "status_age_s": time.time() - status["written_unix"] if status else None},
                    "status": status, "activity": activity,
                    "pools": _pools(plan, status), "channels": self._channels(plan, status, activity),
                    "routes": _routes(plan, status, activity, as_of)}

    def metrics_since(self, since: int, epoch: int) -> dict[str, Any]:
        """The metrics lines from index `since`, or all of them when `epoch` is not the current one; and the axes
        of the page's curves over every line (axes.py)."""
        with self.lock:
            self._read_metrics()
            start = since if epoch == self.metrics_epoch else 0
            return {"epoch": self.metrics_epoch, "from": start, "lines": self.metrics[start:],
                    "next": len(self.metrics), "axes": chart_axes(self.metrics)}

    def sample_rows(self, status: str | None, step: int | None, where: list[str], limit: int) -> dict[str, Any]:
        """The newest `limit` samples that match, as `areal samples` filters them (ConfigError for a bad filter)."""
        with self.lock:
            folder = self.run_dir / SAMPLES
            for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
                fold(self.samples, self._sample_tails.setdefault(path, JsonlTail(path)).read())
            chosen = select(self.samples.values(), status=status, step=step, where=where)
            rows = [_row(r) for r in reversed(chosen[-limit:])]
            return {"total": len(self.samples), "matched": len(chosen), "rows": rows}

    # -- reading ---------------------------------------------------------------------------

    def _plan(self) -> Plan | None:
        if self.plan is None and (self.run_dir / "plan.json").is_file():
            self.plan = Plan.from_json((self.run_dir / "plan.json").read_text())
            self.activity = Activity(self.run_dir, self.plan)
        return self.plan

    def _status(self) -> dict[str, Any] | None:
        try:
            status = json.loads((self.run_dir / STATUS).read_text())
        except (FileNotFoundError, ValueError):
            return None  # not written yet (or a run from before status.json)
        if not self._statuses or self._statuses[-1]["written_unix"] != status["written_unix"]:
            self._statuses.append(status)
        while self._statuses and self._statuses[0]["written_unix"] < status["written_unix"] - WINDOW_S:
            self._statuses.popleft()
        return status

    def _read_metrics(self) -> None:
        lines = self._metrics_tail.read()
        if self._metrics_tail.reset:
            self.metrics, self.metrics_epoch = [], self.metrics_epoch + 1
        self.metrics += lines

    def _channels(self, plan: Plan, status: dict[str, Any] | None,
                  activity: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Per channel: its rates from the senders' spans, and what is between its two ends from the heartbeats."""
        workers = (status or {}).get("workers", {})

        def total(pool: str, count: str) -> int:
            return sum(int(w.get(count, 0)) for w in workers.values() if w["pool"] == pool)

        out: dict[str, dict[str, Any]] = {}
        for c in plan.channels:
            key = f"channel:{c.src}:{c.dst}"
            channel: dict[str, Any] = dict(activity["channels"].get(key, {}))
            if plan.pool(c.src).role == "source":  # sent by the controller: its rate is the gate's
                channel["groups_per_s"] = self._admitted_per_s()
            elif plan.pool(c.dst).role == "train":
                channel["held"] = total(c.dst, "holding")  # gathered for the trainer's coming steps
            elif workers:
                # groups the sender finished minus those the receiver finished (heartbeats: about a second old)
                channel["in_flight"] = max(0, total(c.src, "batches") - total(c.dst, "batches"))
            out[key] = channel
        return out

    def _admitted_per_s(self) -> float | None:
        if len(self._statuses) < 2:
            return None
        first, last = self._statuses[0], self._statuses[-1]
        return (last["gate"]["admitted"] - first["gate"]["admitted"]) / (last["written_unix"] - first["written_unix"])


def _pools(plan: Plan, status: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Per pool: its workers' mean busy fraction (their heartbeats'), how many are up, its share of the CPU the
    workers used so far (each worker's process tree: a code reward's sandbox is its scorer's), and the node calls its
    workers have been in for long (their pulses', chain.LongCalls)."""
    workers = (status or {}).get("workers", {})
    used = sum(w.get("cpu_s", 0.0) for w in workers.values())
    out = {}
    for p in plan.pools:
        mine = [w for w in workers.values() if w["pool"] == p.name]
        out[p.name] = {"replicas": p.replicas, "ready": sum(1 for w in mine if w.get("ready")),
                       "busy": sum(w["busy"] for w in mine) / len(mine) if mine else None,
                       "cpu_share": sum(w.get("cpu_s", 0.0) for w in mine) / used if mine and used else None,
                       "long_calls": [w["long_call"] for w in mine if w.get("long_call")]}
    return out


def _routes(plan: Plan, status: dict[str, Any] | None, activity: dict[str, Any],
            as_of: float) -> dict[str, dict[str, Any]]:
    """Per weights route (trainer pool, follower pool): the newest version published (by the trainer's span, or as
    the controller heard it, whichever is newer) and the version each follower loaded last, each with how long
    before `as_of`."""
    versions = (status or {}).get("versions", {})
    out = {}
    for trainer, follower in plan.weights_routes:
        published = dict(activity["published"].get(trainer) or {})
        heard = versions.get(trainer)
        if heard is not None and heard["version"] > published.get("version", -1):
            published = {"version": heard["version"], "ago_s": as_of - heard["published_unix"]}
        loads = {w: found[trainer] for w, found in activity["followers"].items()
                 if w.rpartition("[")[0] == follower and trainer in found}
        out[f"{trainer}>{follower}"] = {"trainer": trainer, "follower": follower, "published": published,
                                        "followers": loads}
    return out


def _row(record: SampleRecord) -> dict[str, Any]:
    row = asdict(record)
    row["fields"] = {k: (v[:CELL_CHARS] + "…" if isinstance(v, str) and len(v) > CELL_CHARS else v)
                     for k, v in record.fields.items()}
    return row


def _draw(plan: Plan, run_dir: Path) -> str:
    """The run's graph as `areal viz` draws it, from the recipe the run recorded (its copy, else the original)."""
    from areal.graph.recipe import load_recipe
    from areal.graph.viz import to_svg

    problems = []
    for recipe in (run_dir / RECIPE_COPY, Path(plan.recipe)):
        try:
            graph = load_recipe(recipe, plan.overrides).graph
        except Exception as err:  # a recipe is user code: whatever it raises, the rest of the page still works
            problems.append(f"{recipe}: {err}")
            continue
        return to_svg(graph, plan.view(graph), heading=False)
    raise ConfigError("cannot draw the graph: " + "; ".join(problems))

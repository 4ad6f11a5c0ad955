"""What the workers did lately, from their span files (runtime/records/spans.py): the live numbers on the graph.

Over the last WINDOW_S seconds of spans: each node's busy fraction (its calls' time over the window, per
replica) and samples/s, each channel's samples/s and groups/s (the sender's `send` spans) with the share of
time its senders were blocked on it (back-pressure), each trainer's share of time idle before its steps, the
straggler its newest step waited on, and whether a step is under way (its wait ended after its last step did).
Beside the window, what outlasts it: each node's newest call (a step longer than the window still shows), the
version each follower loaded last and the version each trainer published last, with when. The window ends at
`as_of`, which for a finished run is its last span, so a run reopened from its files shows its last seconds as
they were.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal.runtime.compiler.plan import Plan
from areal.runtime.records.spans import span_files
from areal.runtime.records.tail import JsonlTail
from areal.runtime.records.trace import worker_ids

WINDOW_S = 10.0
US = 1_000_000


@dataclass
class WorkerSpans:
    pool: str
    tail: JsonlTail
    recent: deque[dict[str, Any]] = field(default_factory=deque)  # the window's spans, by end time
    loaded: dict[str, tuple[int, int]] = field(default_factory=dict)  # model -> (version, end µs) of its last load
    published: tuple[int, int] | None = None  # a trainer: (version, end µs) of its last publish
    last_wait: dict[str, Any] | None = None  # a trainer: its newest wait span
    last_step_end: int = 0  # a trainer: when its newest step ended (µs); a wait that ended later began a step
    last_call: dict[str, tuple[int, int]] = field(default_factory=dict)  # node -> (start, duration µs), newest


class Activity:
    def __init__(self, run_dir: Path, plan: Plan) -> None:
        self.plan = plan
        self.workers = {w: WorkerSpans(w.rpartition("[")[0], JsonlTail(*span_files(run_dir, w)))
                        for w in worker_ids(plan)}
        self.newest_us = 0

    def update(self) -> None:
        """Read what the workers wrote since the last call."""
        for w in self.workers.values():
            for span in w.tail.read():
                end = span["ts"] + span["dur"]
                self.newest_us = max(self.newest_us, end)
                w.recent.append(span)
                args = span.get("args", {})
                if span["cat"] == "weights":
                    w.loaded[str(args.get("model"))] = (int(args.get("version", 0)), end)
                elif span["cat"] == "publish":
                    w.published = (int(args.get("version", 0)), end)
                elif span["cat"] == "wait":
                    w.last_wait = span
                elif span["cat"] == "step":
                    w.last_step_end = max(w.last_step_end, end)
                elif span["cat"] == "node":
                    w.last_call[span["name"]] = (span["ts"], span["dur"])
        for w in self.workers.values():
            while w.recent and w.recent[0]["ts"] + w.recent[0]["dur"] < self.newest_us - 2 * WINDOW_S * US:
                w.recent.popleft()

    def summary(self, as_of_us: int, since_us: int = 0) -> dict[str, Any]:
        """The numbers over the window ending at `as_of_us` (µs since the epoch), and starting no earlier than
        `since_us` (the run's start: a short run's rates are over its own time)."""
        start = max(as_of_us - int(WINDOW_S * US), since_us)
        window_s = max((as_of_us - start) / US, 1e-3)
        nodes: dict[str, dict[str, Any]] = {}
        channels: dict[str, dict[str, float]] = {}
        trainers: dict[str, dict[str, Any]] = {}
        replicas = {p.name: p.replicas for p in self.plan.pools}
        for w in self.workers.values():
            share = 1.0 / (window_s * replicas[w.pool])  # busy is per replica: a pool's mean
            for span in w.recent:
                end = span["ts"] + span["dur"]
                if end < start or span["ts"] > as_of_us:
                    continue
                seconds = (min(end, as_of_us) - max(span["ts"], start)) / US
                args, cat = span.get("args", {}), span["cat"]
                ended = end <= as_of_us
                if cat in ("node", "decode"):
                    node = nodes.setdefault(span["name"], {"busy": 0.0, "samples_per_s": 0.0, "calls": 0})
                    node["busy"] += seconds * share
                    if ended and cat == "node":
                        node["samples_per_s"] += args.get("samples", 0) / window_s
                        node["calls"] += 1
                elif cat == "send":
                    key = f"channel:{w.pool}:{args.get('to')}"
                    channel = channels.setdefault(key, {"samples_per_s": 0.0, "groups_per_s": 0.0, "blocked": 0.0})
                    channel["blocked"] += seconds * share
                    if ended:
                        channel["samples_per_s"] += args.get("samples", 0) / window_s
                        channel["groups_per_s"] += 1 / window_s
                elif cat == "wait":
                    trainer = trainers.setdefault(w.pool, {"waiting": 0.0})
                    trainer["waiting"] += seconds * share
            for name, (began, took) in w.last_call.items():  # a call longer than the window still shows
                node = nodes.setdefault(name, {"busy": 0.0, "samples_per_s": 0.0, "calls": 0})
                last = node.get("last_call")
                if last is None or as_of_us - began - took < last["ago_s"] * US:
                    node["last_call"] = {"seconds": took / US, "ago_s": (as_of_us - began - took) / US}
            if w.last_wait is not None:
                wait = w.last_wait
                wait_end = wait["ts"] + wait["dur"]
                trainers.setdefault(w.pool, {"waiting": 0.0}).update({
                    "last_wait": {**wait.get("args", {}), "seconds": wait["dur"] / US,
                                  "ago_s": (as_of_us - wait_end) / US},
                    # its last wait ended after its last step: a step is under way since
                    "training_s": (as_of_us - wait_end) / US if wait_end > w.last_step_end else None})
        return {"window_s": window_s, "nodes": nodes, "channels": channels, "trainers": trainers,
                "followers": {worker: {model: {"version": v, "ago_s": (as_of_us - end) / US}
                                       for model, (v, end) in w.loaded.items()}
                              for worker, w in self.workers.items() if w.loaded},
                "published": {w.pool: {"version": w.published[0], "ago_s": (as_of_us - w.published[1]) / US}
                              for w in self.workers.values() if w.published is not None}}

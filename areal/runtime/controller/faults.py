"""What a dead worker gets: a restart (its work re-issued), or the end of the run with the reason.

A worker is dead when its process exits or it is silent for `faults.dead_after_s` (its pulse
thread speaks even while a node computes, so only a frozen process goes silent). The verdict:
- the run stops, naming the node, when a restart would repeat the failure (an error while
  setting up, a node that broke its output contract) or the node's policy is fail-fast;
- it stops with the `--resume` command when a trainer died (its optimizer state lived there)
  or when a generator in a weights group died (it cannot rejoin the group);
- it stops when the node keeps failing (more than `faults.max_restarts` within `window_s`);
- otherwise the worker restarts, and every group started but not consumed is sent again, except
  those a trainer holds once it has drained what was queued for it (the controller asks first).
"""

from __future__ import annotations

import time
from pathlib import Path

from areal.config import FaultConfig
from areal.runtime.compiler.plan import Plan


class Restarts:
    def __init__(self, faults: FaultConfig, plan: Plan) -> None:
        self.faults = faults
        self.plan = plan
        self._times: dict[str, list[float]] = {}

    def verdict(self, pool: str, worker: str, why: str, error: str | None, ready: bool, fatal: bool,
                run_dir: Path, log: Path, tail: str) -> str | None:
        """The message the run stops with, or None: restart the worker (and count the restart)."""
        spec = self.plan.pool(pool)
        policy = next((self.faults.nodes[n] for n in spec.nodes if n in self.faults.nodes), self.faults.policy)
        if error and (policy == "fail-fast" or not ready or fatal):
            # a node that failed while setting up, or broke its contract, fails the same way on every restart
            return f"{error}\n  (worker {worker}{'' if ready else ', while setting up'}; log: {log})"
        cause = f"worker {worker} {why}" + (f": {error}" if error else "")
        where = f"\n  (log: {log})\n{tail}"
        resume = f"continue with `areal run --resume {run_dir}`"
        if self.plan.weights_rendezvous and spec.role == "stream":
            return (f"{cause}{where}\n  with transport.weights=broadcast a generator cannot rejoin the weights "
                    f"group: {resume}, or run with transport.weights=files, where a generator restarts alone")
        if policy == "fail-fast":
            return f"{cause}{where}"
        if spec.role == "train":
            return f"{cause}{where}\n  the trainer holds the optimizer state: {resume}"
        now = time.monotonic()
        recent = [t for t in self._times.get(pool, []) if now - t < self.faults.window_s]
        if len(recent) >= self.faults.max_restarts:
            return (f"node '{spec.nodes[0]}' keeps failing: {len(recent) + 1} failures within "
                    f"{self.faults.window_s:.0f} s, last: {cause}{where}")
        self._times[pool] = [*recent, now]
        return None

    def count(self, pool: str) -> int:
        return len(self._times.get(pool, []))


def log_tail(path: Path, lines: int = 15) -> str:
    """The last lines of a worker's log, indented, for the message a run stops with."""
    try:
        return "\n".join("    " + line for line in path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "    (no log)"

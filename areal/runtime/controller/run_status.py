"""status.json: the controller's live state, rewritten at most twice a second, for `areal view`.

It holds what no worker's file does: the staleness gate (groups admitted, slots open, the group the trainer's
next step waits on, since when, and the version it was admitted at), each trained model's version and when it
was published, each worker's busy fraction, counts and the groups a trainer holds (from their heartbeats, so up
to `faults.heartbeat_s` old), and the accounting. The file is written whole and renamed, so a reader never sees
half of one. Writing it is cheap (a few hundred bytes of JSON, at most every EVERY_S) and can never stop a run:
a failure is logged once and the file is left as it was.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from areal.runtime.controller.controller import Controller

STATUS = "status.json"
EVERY_S = 0.5

log = logging.getLogger("areal.controller")


class StatusWriter:
    """The controller's `on_event` hook: writes status.json, then calls `then` (the progress view's hook)."""

    def __init__(self, run_dir: Path, then: Callable[[Controller], None] | None = None) -> None:
        self.path = Path(run_dir) / STATUS
        self.then = then
        self.published: dict[str, tuple[int, float]] = {}  # model -> (version, unix time the controller heard it)
        self._written_at = float("-inf")
        self._status = ""
        self._broken = False

    def __call__(self, controller: Controller) -> None:
        if self.then is not None:
            self.then(controller)
        if self._broken:
            return
        try:
            self._note_versions(controller)
            now = time.monotonic()
            if controller.state.status == self._status and now - self._written_at < EVERY_S:
                return
            self._written_at, self._status = now, controller.state.status
            tmp = self.path.with_name(f".{STATUS}.tmp")
            tmp.write_text(json.dumps(snapshot(controller, self.published)))
            os.replace(tmp, self.path)
        except Exception:  # the view is never worth a run: say it once, go on without it
            log.warning("status.json for `areal view` is no longer written", exc_info=True)
            self._broken = True

    def _note_versions(self, controller: Controller) -> None:
        for model, version in controller.versions.current.items():
            if self.published.get(model, (None,))[0] != version:
                self.published[model] = (version, time.time())


def snapshot(controller: Controller, published: dict[str, tuple[int, float]]) -> dict[str, Any]:
    """What status.json holds (docs/view.md lists the fields)."""
    c, now = controller, time.time()
    gate = c.admission.gate
    mono = time.monotonic()
    return {
        "written_unix": now,
        "status": c.state.status,
        "version": c.state.version,
        "steps": c.state.steps,
        "elapsed_s": c._elapsed(),
        "started_unix": now - c._elapsed(),  # throughput counts from here (after the workers started)
        "startup_s": c.state.startup_s,
        "gate": {"eta": gate.staleness, "batch_size": gate.batch_size, "admitted": gate.started, "freed": gate.freed,
                 "open": gate.capacity(c.versions.slowest), "unconsumed": len(c.admission.issued),
                 "awaited": _awaited(c, published, now)},
        "versions": {model: {"version": v, "published_unix": t} for model, (v, t) in published.items()},
        "workers": {w.worker_id: {"pool": w.pool, "replica": w.replica, "ready": w.ready, "busy": w.busy,
                                  "cpu_s": w.cpu_total,
                                  "holding": len(w.holding), "silent_s": mono - w.last_seen,
                                  "long_call": w.long_call, **w.counts}
                    for w in c.workers.values()},
        "accounting": c.accounting.summary(),
    }


def _awaited(c: Controller, published: dict[str, tuple[int, float]], now: float) -> dict[str, Any] | None:
    """The oldest group the slowest trainer needs and holds not yet: what its next step waits on."""
    if not c.next_group:
        return None
    trainer, group = min(c.next_group.items(), key=lambda item: item[1])
    held = set().union(*(w.holding for w in c.workers.values() if w.pool == trainer))
    while group in held:
        group += 1
    since = published.get(trainer, (0, now - c._elapsed()))[1]
    found = c.admission.issued.get(group)
    return {"group": group, "trainer": trainer, "trainer_version": c.versions.current.get(trainer, 0),
            "admitted": found is not None, "admitted_at": found[1].admitted_at if found is not None else None,
            "waiting_s": now - since}

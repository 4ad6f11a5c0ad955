"""How the controller recovers from a dead worker: it notices the death, restarts or stops (faults.py decides),
asks every trainer what it holds once its inputs are drained (a census), and re-issues the groups nobody
holds. A mixin of `Controller` (controller.py), which holds the workers and the run's state.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from areal.errors import RunError
from areal.runtime.controller.faults import log_tail
from areal.runtime.wire import messages as msg
from areal.runtime.wire.commands import TakeCensus

if TYPE_CHECKING:
    from areal.runtime.controller.run_state import WorkerProcess

log = logging.getLogger("areal.controller")

WAIT_NOTE_S = 10.0  # a worker not started this long says what it waits for, and again after as long


class WorkerRecovery:
    """The controller's recovery from a dead worker (see the module's docstring)."""

    def _census(self) -> None:
        """After a crash: ask every trainer what it holds once it has drained its inputs, then re-issue the rest
        of the groups started before the crash (those started since went to live workers).

        A trainer busy in a long update reports in its heartbeats only the groups it gathered before it; those
        queued for it since are not lost, and re-issuing them would generate (and filter, and free) them again.
        """
        self._census_seq += 1
        self._census_scope |= self.admission.issued.keys()
        asked = [w for w in self.workers.values() if w.ready and self.plan.pool(w.pool).role == "train"
                 and not (self.plan.pool(w.pool).rendezvous and w.replica > 0)]  # rank 0 takes a trainer's data
        self._census_due = {w.worker_id for w in asked}
        for w in asked:
            self.control.send(w.worker_id, TakeCensus(seq=self._census_seq))
        if not self._census_due:
            self._reissue_after_crash()

    def _on_census(self, worker: WorkerProcess, m: msg.Census) -> None:
        worker.holding = set(m.holding)
        if m.seq == self._census_seq and worker.worker_id in self._census_due:
            self._census_due.discard(worker.worker_id)
            if not self._census_due and not self._stopping:
                self._reissue_after_crash()

    def _reissue_after_crash(self) -> None:
        """Send again every group started before the crash that no trainer holds, and the held-out rounds in
        flight: the dead worker may have held any of them. Trainers drop the copies they have."""
        scope, self._census_scope = self._census_scope, set()
        self._reissue(scope)
        for batch, meta in self.heldout.in_flight() if self.heldout is not None else []:
            self._send_source(batch, meta)

    def _reissue(self, only: set[int]) -> None:
        """Send again the groups in `only` that no trainer holds and none is decided for (`_decided`)."""
        held = set().union(*(w.holding for w in self.workers.values()))
        for batch, meta in self.admission.reissue(held | self._decided(), only):
            self.accounting.reissued += 1
            self._send_source(batch, meta)

    def _decided(self) -> set[int]:
        """Groups whose fate is settled above the frontier: taken by every trainer (a policy that trains in
        finishing order takes them out of order), or lost whole (every sample dropped, failed or filtered) where
        no trainer waits for them in admission order. A copy of one would only be generated and dropped again."""
        taken = set.intersection(*self.taken.values()) if self.taken else set()
        return taken | (set() if self.staleness_policy.in_order else self.accounting.lost)

    def _check_processes(self) -> None:
        now = time.monotonic()
        for w in list(self.workers.values()):
            code = w.process.poll()
            if code is None and not w.ready and now - w.noted_wait > WAIT_NOTE_S:
                self._note_wait(w, now)
            if code is None and w.ready and now - w.last_seen > self.config.faults.dead_after_s:
                why = f"was silent for {now - w.last_seen:.0f} s (no heartbeat)"
                w.process.kill()
            elif code is None and w.replacement and not w.ready and w.process.waiting() is None \
                    and now - w.started_at > self.config.faults.ready_timeout_s:  # a first start: _await_ready's
                why = f"was not ready {now - w.started_at:.0f} s after it started"
            elif code is not None and not self._stopping:
                self._listen(200)  # its last words (an "error" event) may still be in flight
                why = f"exited with code {code}" + (f" ({w.process.ended_by})" if w.process.ended_by else "")
            else:
                continue
            self._on_worker_death(w, why)

    def _note_wait(self, w: WorkerProcess, now: float) -> None:
        """Say, once a while, what a worker that has not started waits for (Ray: a node with room for it)."""
        why = w.process.waiting()
        if why is not None and now - w.started_at > WAIT_NOTE_S:
            w.noted_wait = now
            log.warning("%s", why)
            self.metrics.write({"kind": "waiting", "worker": w.worker_id, "why": why, "wall_s": self._wall()})

    def _on_worker_death(self, w: WorkerProcess, why: str) -> None:
        """Restart the worker and re-issue what it may have held, or stop the run naming the node."""
        w.process.kill()  # what the dead worker started (its process group) dies with it
        stop = self.restarts.verdict(w.pool, w.worker_id, why, w.last_error, w.ready, w.fatal, self.run_dir,
                                     w.log_path, log_tail(w.log_path))
        if stop is not None:
            raise RunError(stop)
        cause = f"worker {w.worker_id} {why}" + (f": {w.last_error}" if w.last_error else "")
        log.warning("%s; restarting it (%d/%d in %.0f s)", cause, self.restarts.count(w.pool),
                    self.config.faults.max_restarts, self.config.faults.window_s)
        self.metrics.write({"kind": "restart", "worker": w.worker_id, "why": cause, "wall_s": self._wall()})
        self._spawn(w.pool, w.replica)
        self._census()

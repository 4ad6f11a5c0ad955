"""What the controller does with the workers' reports of work: published versions and their step records,
failed, filtered, dropped, recycled and noted samples, held-out scores, checkpoints, refused batches, node metrics,
errors, and the files a worker on a node without the run directory writes. A mixin of `Controller`
(controller.py), which holds the run's state these handlers update; `HANDLERS` there maps each message class to
its handler.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal.errors import RunError
from areal.runtime.storage import mirror, weight_files
from areal.runtime.storage.checkpoint import find_checkpoints
from areal.runtime.storage.rundir import WriteFailed, writing
from areal.runtime.wire import messages as msg
from areal.runtime.wire.commands import EndTraining, ForgetBelow

if TYPE_CHECKING:
    from areal.runtime.controller.run_state import WorkerProcess

log = logging.getLogger("areal.controller")

LOST_GROUPS_BATCHES = 10  # this many steps' worth of groups lost in a row, and nothing trained: the run stops


class WorkerReports:
    """The handlers of the workers' reports of work (see the module's docstring)."""

    def _on_version(self, worker: WorkerProcess, m: msg.VersionPublished) -> None:
        self.versions.record(m.model, m.version, m.via)
        self.state.version = self.versions.slowest
        if m.sample_ids:
            self._lost_in_a_row = 0
        self.accounting.on_trained(m.model, m.sample_ids)
        self.next_group[m.model] = m.next_group
        frontier = min(self.next_group.values())
        self.taken[m.model] = {g for g in self.taken[m.model] | set(m.groups) if g >= frontier}
        self.admission.consumed(frontier)
        for w in self.workers.values():
            if self.plan.pool(w.pool).role == "map":
                self.control.send(w.worker_id, ForgetBelow(group=frontier))
        if m.model == self.accounting.counted:
            self.accounting.on_consumed(m.groups)
            self.accounting.check(m.version, m.groups, time.monotonic(), self.config.faults.dead_after_s)
            self._step_record(m)
        else:  # another trainer's numbers (a critic's loss) join the next step record, named by it
            self.steps.on_metrics({f"{m.model}_{k}": v for k, v in m.stats.items() if isinstance(v, (int, float))})
        if m.via is not None:
            self.versions.announce(m.model, self.workers.values(), self.control.send)
        every = self.config.eval.interval_steps
        if (self.heldout is not None and every and m.model == (self.plan.policy or m.model)
                and m.version % every == 0 and m.version < self.state.steps):
            self._start_eval()

    def _end_training(self) -> None:
        """max_minutes: every trainer takes no further step; wait (a step's length at most, as long calls are said)
        until each has said the version it ended at, so the run's last versions are known before its last round."""
        log.info("max_minutes reached at version %d: training ends", self.state.version)
        self.training_ended: set[str] = set()  # the trainers that said their last version
        for w in self.workers.values():
            if self.plan.pool(w.pool).role == "train":
                self.control.send(w.worker_id, EndTraining())
        deadline = time.monotonic() + self.config.faults.long_call_s
        while set(self.trainers) - self.training_ended and time.monotonic() < deadline:
            self._listen(100)
            self._check_processes()
        if missing := sorted(set(self.trainers) - self.training_ended):
            log.warning("%s did not end training within %.0f s: the last held-out round may read later weights",
                        ", ".join(missing), self.config.faults.long_call_s)

    def _on_training_ended(self, worker: WorkerProcess, m: msg.TrainingEnded) -> None:
        log.info("%s took its last step: version %d", m.model, m.version)
        self.training_ended.add(m.model)

    def _step_record(self, m: msg.VersionPublished) -> None:
        self.state.staleness.update({int(k): int(v) for k, v in m.staleness.items()})
        self.state.trained_tokens += m.tokens
        self.state.masked_tokens += int(m.stats.get("masked_tokens", 0))
        self.state.stale_tokens += int(m.stats.get("stale_tokens", 0))
        self.state.truncated_masked += int(m.stats.get("truncated_masked", 0))
        elapsed = self._elapsed()
        record = self.steps.record(m, elapsed=elapsed, versions=self.versions.current,
                                   trained=len(self.accounting.trained), accounting=self.accounting.summary(),
                                   generated_tokens=sum(w.counts.get("tokens", 0) for w in self.workers.values()),
                                   trained_tokens=self.state.trained_tokens,
                                   busy={w.worker_id: w.busy for w in self.workers.values()})
        noted = [self.accounting.noted.get(sid) for sid in m.sample_ids]  # what the generators said of them
        record |= {f"{why}_share": noted.count(why) / len(noted) if noted else 0.0 for why in ("empty", "over_long")}
        # the controller's own load: CPU seconds of this process (all its threads) and control messages
        record |= {"controller_cpu_s": time.process_time(),
                   "control_messages": self.control.received + self.control.sent,
                   # each worker's process tree, so far: a code reward's sandboxed programs count as its worker's
                   "cpu_s": {w.worker_id: round(w.cpu_total, 2) for w in self.workers.values()}}
        record["wall_s"] = self._wall(elapsed)  # the run's seconds; its rates are over this process's own
        self.state.last_step = record
        if self.state.first_entropy is None:
            self.state.first_entropy = record.get("entropy")
        for line in [record, *self.steps.warnings(record)]:
            self.metrics.write(line)

    def _on_failed(self, worker: WorkerProcess, m: msg.SamplesFailed) -> None:
        reasons = [f"{m.node}: {r}" for r in m.reasons]
        if m.sample_ids and self.config.faults.nodes.get(m.node, self.config.faults.policy) == "fail-fast":
            raise RunError(f"node '{m.node}': sample {m.sample_ids[0]} failed at version {self.state.version}: "
                           f"{m.reasons[0]} (faults.policy=fail-fast stops at the first failure)")
        if m.eval:
            for record in self.heldout.failed(m.sample_ids) if self.heldout is not None else []:
                self._eval_done(record)
            return
        self._free(self.accounting.on_failed(m.sample_ids, reasons), f"{reasons[0]}" if reasons else "failed")
        for sid, reason in zip(m.sample_ids, reasons):
            log.warning("sample %d failed: %s", sid, reason)
            self.metrics.write({"kind": "failed", "sample_id": sid, "reason": reason, "wall_s": self._wall()})

    def _on_filtered(self, worker: WorkerProcess, m: msg.SamplesFiltered) -> None:
        self._free(self.accounting.on_filtered(m.sample_ids, [f"{m.node}: {r}" for r in m.reasons]),
                   f"filtered by '{m.node}': {m.reasons[0] if m.reasons else ''}")

    def _free(self, groups: list[int], why: str) -> None:
        """Groups that will never be trained give their slots to new ones; a run that only loses groups stops, once:
        the groups in flight that fail while it stops free their slots and say nothing more."""
        self.admission.free(groups)
        self._lost_in_a_row += len(groups)
        limit = LOST_GROUPS_BATCHES * self.config.batch_size
        if self._lost_in_a_row > limit and not self._stopping:
            raise RunError(f"no sample of the last {self._lost_in_a_row} groups reached a trainer since version "
                           f"{self.state.version} (the last: {why}); the run cannot make progress")

    def _on_dropped(self, worker: WorkerProcess, m: msg.SamplesDropped) -> None:
        """The staleness policy dropped samples too old to train within η: counted with the tokens they wasted,
        and a group lost whole frees its slot for another."""
        reason = f"{m.node}: {m.reason}"
        if self.sample_log is not None:  # a copy of a sample decided already (trained, say) is no news of it
            fresh = [(sid, n) for sid, n in zip(m.sample_ids, m.tokens) if not self.accounting.decided(sid)]
            self.sample_log.dropped(m.node, [sid for sid, _ in fresh], [n for _, n in fresh], reason)
        self._free(self.accounting.on_dropped(m.sample_ids, m.tokens, reason), reason)
        self.metrics.write({"kind": "dropped", "sample_ids": m.sample_ids, "tokens": sum(m.tokens), "reason": reason,
                            "wall_s": self._wall()})

    def _on_recycled(self, worker: WorkerProcess, m: msg.GroupsRecycled) -> None:
        """Groups re-queued in a generator, stamped `m.version`: counted, and logged so a run can be audited."""
        self.accounting.on_recycled(m.groups, m.tokens)
        self.metrics.write({"kind": "recycled", "node": m.node, "version": m.version, "groups": m.groups,
                            "tokens": sum(m.tokens), "wall_s": self._wall()})

    def _on_noted(self, worker: WorkerProcess, m: msg.SamplesNoted) -> None:
        self.accounting.on_noted(m.sample_ids, m.reasons)

    def _on_eval(self, worker: WorkerProcess, m: msg.HeldOutScored) -> None:
        record = self.heldout.scored(m.round, m.sample_ids, m.rewards, m.solved) if self.heldout is not None else None
        if record is not None:
            self._eval_done(record)

    def _on_checkpoint(self, worker: WorkerProcess, m: msg.CheckpointWritten) -> None:
        self.sealing.part_written(m.path, m.model, m.version, m.next_group, m.consumed, self._checkpoint_state)

    def _unsealed(self, staged: Path | None) -> WriteFailed | None:
        """The exit checkpoint asked for at `staged` and never sealed, a trainer having failed to write its part (a
        full disk, say): the run did not end as it says. Its staging folder goes, to give back the space."""
        if staged is None or str(staged) in self.sealing.sealed:
            return None
        version = max(self.versions.current.values(), default=0)  # where the trainers were
        shutil.rmtree(staged, ignore_errors=True)
        why = next((f"{w.worker_id}: {w.last_error.splitlines()[0]}" for w in self.workers.values()
                    if self.plan.pool(w.pool).role == "train" and w.last_error), "no trainer said why")
        newest = find_checkpoints(self.run_dir).newest
        kept = (f"the newest checkpoint is {newest.name}, which `areal run --resume {self.run_dir}` continues from"
                if newest else "the run has no checkpoint: a resume starts it again")
        weights = weight_files.published(self.plan.weights_dir, self.plan.policy, version)
        trained = f"; version {version}'s policy weights are in {weights}" if weights.is_file() else ""
        return WriteFailed(f"the exit checkpoint at version {version} was not written ({why}); {kept} once the "
                           f"cause is mended{trained}")

    def _on_file(self, worker: WorkerProcess, m: msg.FileWritten) -> None:
        """A piece of a file written in a worker's copy of the run directory (storage/mirror.py), into the run
        directory; a checkpoint part's pieces come before its report, so it is whole when it is sealed."""
        try:
            with writing(self.run_dir / m.path, self.run_dir):
                mirror.write(self.run_dir, mirror.Piece(m.path, m.data, m.fresh))
        except ValueError as err:
            log.warning("%s: %s", worker.worker_id, err)

    def _checkpoint_state(self, start: int) -> dict[str, Any]:
        """What a resume needs of the controller, as of group `start` (the first not every trainer trained)."""
        first_sample = start * self.config.group_size

        def decided(sid: int) -> bool:  # its group will not start again: below `start`, or consumed out of order
            return sid < first_sample or sid // self.config.group_size in self.accounting.consumed

        return {
            "source": self.admission.cursor_at(start),
            "accounting": self.accounting.summary(),
            "trained_ids": sorted(self.accounting.trained),
            "failed": {str(k): v for k, v in self.accounting.failed.items() if decided(k)},
            "filtered": {str(k): v for k, v in self.accounting.filtered.items() if decided(k)},
            "dropped": {str(k): v for k, v in self.accounting.dropped.items() if decided(k)},
            "noted": {str(k): v for k, v in self.accounting.noted.items() if decided(k)},
            "metrics_lines": self.metrics.lines,
            "wall_s": self._wall(),
            "eval_round": self.heldout.next_round if self.heldout is not None else 0,
        }

    def _on_duplicate(self, worker: WorkerProcess, m: msg.DuplicateDropped) -> None:
        self.accounting.duplicates += 1

    def _on_rejected(self, worker: WorkerProcess, m: msg.BatchRefused) -> None:
        """A worker refused a malformed batch: logged with the reason; groups of ours it named are sent again.

        A refused group never reaches the trainer, which waits for every group of its batch, so failing its
        samples would stall the run: re-issuing (as after a crash) keeps every sample's count exact.
        """
        reason = f"refused by {worker.worker_id}: {m.reason}"
        log.warning("%s", reason)
        groups = sorted(set(m.groups) & self.admission.issued.keys())
        self.metrics.write({"kind": "rejected", "worker": worker.worker_id, "reason": reason, "groups": groups,
                            "wall_s": self._wall()})
        self._reissue(only=set(groups))

    def _on_metrics(self, worker: WorkerProcess, m: msg.NodeMetrics) -> None:
        self.steps.on_metrics(m.values)

    def _on_error(self, worker: WorkerProcess, m: msg.WorkerError) -> None:
        where = f"node '{m.node}'" if m.node else f"worker {worker.worker_id}"
        prefix = "" if m.message.startswith(("node '", "recipe")) or ": node '" in m.message else f"{where}: "
        worker.last_error = f"{prefix}{m.message}"
        worker.fatal = m.fatal
        log.error("%s reported: %s", worker.worker_id, worker.last_error)

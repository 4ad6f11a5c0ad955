"""The controller: starts the workers, feeds the source through the staleness gate, and answers events.

This module is the event loop. What it decides with lives next to it: admission (the source
and the gate), versions (one per trained model, and what followers hold), evaluation (held-out
rounds), faults (what a dead worker gets), checkpoint (sealing what the trainers wrote),
accounting (where every sample is). Workers' messages are typed (messages.py) and dispatched
by class through `HANDLERS`. On an ending signal (signals.py) or a worker's error it stops every
worker, asks the trainers for a final checkpoint when the run is healthy, and kills whatever is
left by pid.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal.config import RunConfig
from areal.errors import ConfigError, RunError, WireError
from areal.graph.batch import Batch
from areal.graph.graph import Graph
from areal.graph.meta import GroupMeta
from areal.runtime import messages as msg
from areal.runtime.accounting import Accounting
from areal.runtime.admission import Admission, configured
from areal.runtime.channels import is_dynamic, private_folder
from areal.runtime.checkpoint import Sealing, final_dir, staging_dir
from areal.runtime.commands import ForgetBelow, Stop, TakeCensus
from areal.runtime.control import ControlServer, Pulse
from areal.runtime.evaluation import HeldOut, first_pass
from areal.runtime.faults import Restarts, log_tail
from areal.runtime.metrics import MetricsWriter
from areal.runtime.outbox import Outbox
from areal.runtime.placement import WorkerHandle, launcher_for, worker_spec
from areal.runtime.plan import Plan
from areal.runtime.resume import RECIPE_COPY
from areal.runtime.rundir import RunDirLock, WriteFailed, write_atomically, writing
from areal.runtime.security import RunKey
from areal.runtime.signals import EndingSignals
from areal.runtime.steps import StepRecorder
from areal.runtime.versions import Versions
from areal.runtime.wiring import Wiring

log = logging.getLogger("areal.controller")

READY_TIMEOUT_S = 600.0  # a worker may build the warm-start model on first use
STOP_TIMEOUT_S = 60.0
LOST_GROUPS_BATCHES = 10  # this many steps' worth of groups lost in a row, and nothing trained: the run stops


@dataclass
class WorkerProcess:
    worker_id: str
    pool: str
    replica: int
    process: WorkerHandle  # a local child process or a Ray actor (areal.runtime.placement)
    log_path: Path
    ready: bool = False
    last_seen: float = field(default_factory=time.monotonic)
    busy: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    last_error: str | None = None
    fatal: bool = False  # its error is one a restart would repeat (a node that broke its contract)
    holding: set[int] = field(default_factory=set)  # groups a trainer has gathered, not yet trained


@dataclass
class RunState:
    """What the progress view and the summary read."""

    version: int = 0  # the slowest trainer's
    steps: int = 0
    started_at: float = field(default_factory=time.monotonic)
    last_step: dict[str, Any] = field(default_factory=dict)  # the policy trainer's newest step record
    evals: list[dict[str, Any]] = field(default_factory=list)
    staleness: Counter[int] = field(default_factory=Counter)
    trained_tokens: int = 0
    masked_tokens: int = 0  # output tokens of trained samples the staleness policy masked (older than η)
    stale_tokens: int = 0  # output tokens the loss read that were older than η (the admission policy's)
    startup_s: float = 0.0
    status: str = "starting"


class Controller:
    def __init__(self, plan: Plan, graph: Graph, config: RunConfig, *, saved: dict[str, Any] | None = None,
                 resume_dir: Path | None = None, on_event: Callable[[Controller], None] | None = None,
                 lock: RunDirLock | None = None) -> None:
        """`saved` is a checkpoint's controller.json when resuming: versions, source cursor, accounting; `lock`
        holds the run directory (rundir.py), released when the run ends."""
        self.plan = plan
        self.graph = graph
        self.config = config
        self.run_dir = Path(plan.run_dir)
        self.lock = lock
        self.resume_dir = resume_dir
        self.on_event = on_event or (lambda _: None)
        self.source_node = graph.nodes[plan.pools[0].nodes[0]]
        if saved and config.sampling_lag:
            raise ConfigError("mode=lagged: a run cannot resume (the checkpoint holds the newest policy, not the "
                              "lagged ones the generators sample from); start it again")
        start_version = int(saved["version"]) if saved else 0
        next_groups = {str(k): int(v) for k, v in (saved or {}).get("next_group", {}).items()}
        start_group = min(next_groups.values(), default=start_version * config.batch_size)
        tasks = configured(self.source_node.spec.instantiate(), config)
        if saved and saved.get("source"):
            tasks.restore(saved["source"])
        consumed = [set(groups) for groups in (saved or {}).get("consumed", {}).values()]  # out of order, each trainer
        self.admission = Admission(self.source_node, tasks, plan, config.batch_size, config.admission_staleness,
                                   config.group_size, start_group=start_group,
                                   freed=start_group - start_version * config.batch_size,
                                   done=frozenset(set.intersection(*consumed) if consumed else ()))
        self.versions = Versions(plan, start_version, config.sampling_lag, resumed=resume_dir)
        self.trainers = [p.name for p in plan.trainer_pools()]
        self.next_group = {t: next_groups.get(t, start_group) for t in self.trainers}
        self.accounting = Accounting(config.group_size, counted=plan.policy or next(iter(self.trainers), ""),
                                     started_groups=start_group)
        if saved:
            self.accounting.trained = set(saved.get("trained_ids", []))
            self.accounting.failed = {int(k): v for k, v in saved.get("failed", {}).items()}
            self.accounting.filtered = {int(k): v for k, v in saved.get("filtered", {}).items()}
            self.accounting.dropped = {int(k): v for k, v in saved.get("dropped", {}).items()}
            self.accounting.noted = {int(k): v for k, v in saved.get("noted", {}).items()}
        heldout = configured(graph.heldout.get(self.source_node.name), config)
        # the same held-out tasks every round, so pass@1 is comparable across versions
        self.heldout = (HeldOut(first_pass(heldout, config.eval.tasks), config.eval.samples,
                                first_round=int(saved.get("eval_round", 0)) if saved else 0)
                        if heldout is not None else None)
        self.state = RunState(version=start_version, steps=config.steps)
        self.metrics = MetricsWriter(self.run_dir / "metrics.jsonl",
                                     keep_lines=int(saved.get("metrics_lines", 0)) if saved else None)
        # a resumed run's rates count only its own work
        self.steps = StepRecorder(len(self.accounting.trained), config.group_size, len(self.trainers) > 1)
        self.restarts = Restarts(config.faults, plan)
        self.workers: dict[str, WorkerProcess] = {}
        self.bad_tasks: list[str] = []
        self._stopping = False
        self._plan_path = self.run_dir / "plan.json"
        self.sealing = Sealing(self.run_dir, Path(plan.weights_dir), self.trainers, config.checkpoint.keep)
        self._lost_in_a_row = 0  # groups freed since a trainer last trained a sample
        self._census_seq = 0
        self._census_due: set[str] = set()  # trainers asked what they hold; the re-issue waits for their answers
        self._census_scope: set[int] = set()  # the groups started before the crash: those the re-issue covers
        self._dynamic = any(is_dynamic(c.endpoints) for c in plan.channels)  # Ray: workers bind where they land

    # -- lifecycle ----------------------------------------------------------------------

    def run(self) -> RunState:
        """Start the workers and answer events until the last step, a signal or an error; then stop every worker.
        The run directory's lock is released last."""
        try:
            return self._run()
        finally:
            if self.lock is not None:
                self.lock.release()

    def _run(self) -> RunState:
        with writing(self.run_dir / "sockets", self.run_dir):
            private_folder(self.run_dir / "sockets")
            (self.run_dir / "logs").mkdir(exist_ok=True)
            key = RunKey.create() if self.plan.secured else None  # TCP: the workers read the key made for this run
            if key is not None:
                key.write(self.run_dir)
        self.control = ControlServer(self.plan.control_endpoint, key)
        self.plan = dataclasses.replace(self.plan, control_endpoint=self.control.endpoint)
        self.source_out = {c.dst: Outbox(c, self.plan, key) for c in self.plan.outputs_of(self.source_node.name)}
        self.wiring = Wiring(self.plan, self.source_node.name, self.source_out, self.control.send)
        error: BaseException | None = None
        with EndingSignals(stopping=lambda: self._stopping):
            try:
                write_atomically(self._plan_path, self.plan.to_json(), self.run_dir)
                write_atomically(self.run_dir / "config.json", self.config.model_dump_json(indent=2) + "\n",
                                 self.run_dir)
                write_atomically(self.run_dir / RECIPE_COPY, Path(self.plan.recipe).read_text(), self.run_dir)
                for pool in self.plan.pools[1:]:
                    for replica in range(pool.replicas):
                        self._spawn(pool.name, replica)
                self._await_ready()
                self.state.startup_s = time.monotonic() - self.state.started_at
                self.state.started_at = time.monotonic()  # throughput counts from here: startup is reported apart
                self.state.status = "running"
                self._loop()
            except BaseException as err:
                error = err
            finally:
                unwritten = self._shutdown(healthy=error is None or isinstance(error, KeyboardInterrupt))
                for outbox in self.source_out.values():
                    outbox.close()
                self.control.close()
                self.metrics.close()
                _remove_socket_files(self.plan)
        if unwritten is not None and (error is None or isinstance(error, KeyboardInterrupt)):
            error = unwritten  # the exit checkpoint failed: the run did not end as it says
        if error is not None:
            raise error
        return self.state

    def _spawn(self, pool: str, replica: int) -> None:
        worker_id = f"{pool}[{replica}]"
        log_path = self.run_dir / "logs" / f"{pool}-{replica}.log"
        spec = self.plan.pool(pool)
        version = self.versions.current[pool] if spec.role == "train" else self.versions.sampled(spec.model or None)
        launch = worker_spec(self.plan, self._plan_path, pool, replica, version, self.resume_dir, log_path)
        try:
            process = launcher_for(self.config.cluster).start(launch)
        except OSError as err:  # its log cannot be opened: a run directory made read-only, a full disk
            raise RunError(f"cannot start {worker_id}: {err.strerror} ({err.filename or log_path}); a run needs "
                           f"its directory {self.run_dir} writable to the end") from None
        self.workers[worker_id] = WorkerProcess(worker_id, pool, replica, process, log_path)

    def _await_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not all(w.ready for w in self.workers.values()):
            if time.monotonic() > deadline:
                late = [w.worker_id for w in self.workers.values() if not w.ready]
                raise RunError(f"workers not ready after {READY_TIMEOUT_S:.0f} s: {', '.join(late)}")
            self._listen(200)
            self._check_processes()

    def _loop(self) -> None:
        limit = self.config.max_minutes * 60 if self.config.max_minutes else None
        if self.heldout is not None:
            self._start_eval()
        while self.state.version < self.state.steps:
            self._admit()
            self._listen(50)
            self._check_processes()
            self.accounting.overdue(time.monotonic(), self.config.faults.dead_after_s)
            if limit is not None and time.monotonic() - self.state.started_at > limit:
                log.info("max_minutes reached at version %d", self.state.version)
                break
        if self.heldout is not None and self.state.version > 0:
            self.versions.lag = 0  # training is over: the last held-out round judges the trained policy
            self.versions.announce(self.plan.policy, self.workers.values(), self.control.send)
            self._start_eval()
            deadline = time.monotonic() + 300
            while self.heldout.pending and time.monotonic() < deadline:
                self._listen(100)
                self._check_processes()

    def _shutdown(self, healthy: bool) -> WriteFailed | None:
        """Stop every worker (with an exit checkpoint when healthy); the first write that failed meanwhile."""
        self._stopping = True
        self.state.status = "stopping"
        self.on_event(self)
        # the exit checkpoint: when every trainer is at one version that has none yet (none is rewritten)
        versions = set(self.versions.current.values())
        checkpoint = None
        if healthy and len(versions) == 1 and (v := versions.pop()) > 0 and not final_dir(self.run_dir, v).exists():
            checkpoint = staging_dir(self.run_dir, v)
        for w in self.workers.values():
            trainer = self.plan.pool(w.pool).role == "train"
            self.control.send(w.worker_id, Stop(checkpoint=str(checkpoint) if checkpoint and trainer else None))
        deadline = time.monotonic() + STOP_TIMEOUT_S
        unwritten = None
        while any(w.process.poll() is None for w in self.workers.values()) and time.monotonic() < deadline:
            try:
                self._listen(100)
            except RunError as err:
                log.error("while stopping: %s", err)
                if isinstance(err, WriteFailed):
                    unwritten = unwritten or err
        for w in self.workers.values():
            if w.process.poll() is None:
                log.warning("killing %s (pid %d): it did not stop within %.0f s", w.worker_id, w.process.pid,
                            STOP_TIMEOUT_S)
            w.process.kill()
        self.state.status = "stopped"
        self.on_event(self)
        return unwritten

    # -- the source -----------------------------------------------------------------------

    def _admit(self) -> None:
        if self._stopping:
            return
        for batch, meta in self.admission.admit(self.versions.slowest, self.versions.sampled()):
            self._send_source(batch, meta)
        self.accounting.started_groups = self.admission.gate.started  # groups consumed before a resume too
        for problem in self.admission.new_problems():
            log.warning("skipped a task record: %s", problem)
            self.metrics.write({"kind": "bad_task", "problem": problem, "wall_s": self._elapsed()})
            self.bad_tasks.append(problem)

    @property
    def skipped_tasks(self) -> int:
        return self.admission.skipped

    def _send_source(self, batch: Batch, meta: GroupMeta) -> None:
        for outbox in self.source_out.values():
            while True:
                try:
                    outbox.send(batch, meta, timeout_ms=200)
                    break
                except TimeoutError:
                    self._listen(0)
                    self._check_processes()

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
        """Send again the groups in `only` that no trainer holds (nor consumed)."""
        held = set().union(*(w.holding for w in self.workers.values()))
        for batch, meta in self.admission.reissue(held, only):
            self.accounting.reissued += 1
            self._send_source(batch, meta)

    # -- evaluation -----------------------------------------------------------------------

    def _start_eval(self) -> None:
        assert self.heldout is not None
        # the policy the generators sample with (in lagged mode, not the trainer's newest)
        batch, meta = self.heldout.start(self.versions.sampled(), self.admission.task_batch)
        self._send_source(batch, meta)

    def _eval_done(self, record: dict[str, Any]) -> None:
        record["wall_s"] = self._elapsed()
        self.state.evals.append(record)
        self.metrics.write(record)

    # -- events ---------------------------------------------------------------------------

    def _listen(self, timeout_ms: int) -> None:
        got = self.control.recv(timeout_ms)
        while got is not None:
            self._handle(*got)
            got = self.control.recv(0)

    def _handle(self, sender: str, raw: dict[str, Any]) -> None:
        if sender.endswith(Pulse.SUFFIX):  # alive, from the worker's pulse thread: nothing else to read
            pulsing = self.workers.get(sender.removesuffix(Pulse.SUFFIX))
            if pulsing is not None:
                pulsing.last_seen = time.monotonic()
            return
        worker = self.workers.get(sender)
        if worker is None:
            log.warning("control message from unknown worker %r ignored", sender)
            return
        worker.last_seen = time.monotonic()
        try:
            message = msg.parse(raw, sender)
        except WireError as err:
            log.warning("%s", err)
            return
        HANDLERS[type(message)](self, worker, message)
        self.on_event(self)

    def _on_alive(self, worker: WorkerProcess, m: msg.Alive) -> None:
        """Nothing to do: any message marks its worker seen (pulses come on a socket of their own, read above)."""

    def _on_ready(self, worker: WorkerProcess, m: msg.Ready) -> None:
        worker.ready = True
        if self._dynamic:
            self.wiring.wire(worker, m.endpoints, self.workers.values())
        self.versions.catch_up(worker, self.control.send)

    def _on_heartbeat(self, worker: WorkerProcess, m: msg.Heartbeat | msg.Stopped) -> None:
        worker.busy = getattr(m, "busy", worker.busy)
        worker.holding = set(getattr(m, "holding", worker.holding))
        worker.counts = {"batches": m.batches, "samples": m.samples, "tokens": m.tokens}

    def _on_version(self, worker: WorkerProcess, m: msg.VersionPublished) -> None:
        self.versions.record(m.model, m.version, m.path)
        self.state.version = self.versions.slowest
        if m.sample_ids:
            self._lost_in_a_row = 0
        self.accounting.on_trained(m.model, m.sample_ids)
        self.next_group[m.model] = m.next_group
        frontier = min(self.next_group.values())
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
        if m.path or m.broadcast:
            self.versions.announce(m.model, self.workers.values(), self.control.send, broadcast=m.broadcast)
        every = self.config.eval.interval_steps
        if (self.heldout is not None and every and m.model == (self.plan.policy or m.model)
                and m.version % every == 0 and m.version < self.state.steps):
            self._start_eval()

    def _step_record(self, m: msg.VersionPublished) -> None:
        self.state.staleness.update({int(k): int(v) for k, v in m.staleness.items()})
        self.state.trained_tokens += m.tokens
        self.state.masked_tokens += int(m.stats.get("masked_tokens", 0))
        self.state.stale_tokens += int(m.stats.get("stale_tokens", 0))
        record = self.steps.record(m, elapsed=self._elapsed(), versions=self.versions.current,
                                   trained=len(self.accounting.trained), accounting=self.accounting.summary(),
                                   generated_tokens=sum(w.counts.get("tokens", 0) for w in self.workers.values()),
                                   trained_tokens=self.state.trained_tokens,
                                   busy={w.worker_id: w.busy for w in self.workers.values()})
        # the controller's own load: CPU seconds of this process (all its threads) and control messages
        record |= {"controller_cpu_s": time.process_time(),
                   "control_messages": self.control.received + self.control.sent}
        self.state.last_step = record
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
        if not self.plan.pool(worker.pool).reaches_trainer:  # a side branch: the samples still train
            for sid, reason in zip(m.sample_ids, reasons):
                self.metrics.write({"kind": "branch_failed", "sample_id": sid, "reason": reason,
                                    "wall_s": self._elapsed()})
            return
        self._free(self.accounting.on_failed(m.sample_ids, reasons), f"{reasons[0]}" if reasons else "failed")
        for sid, reason in zip(m.sample_ids, reasons):
            log.warning("sample %d failed: %s", sid, reason)
            self.metrics.write({"kind": "failed", "sample_id": sid, "reason": reason, "wall_s": self._elapsed()})

    def _on_filtered(self, worker: WorkerProcess, m: msg.SamplesFiltered) -> None:
        self._free(self.accounting.on_filtered(m.sample_ids, [f"{m.node}: {r}" for r in m.reasons]),
                   f"filtered by '{m.node}': {m.reasons[0] if m.reasons else ''}")

    def _free(self, groups: list[int], why: str) -> None:
        """Groups that will never be trained give their slots to new ones; a run that only loses groups stops."""
        self.admission.free(groups)
        self._lost_in_a_row += len(groups)
        limit = LOST_GROUPS_BATCHES * self.config.batch_size
        if self._lost_in_a_row > limit:
            raise RunError(f"no sample of the last {self._lost_in_a_row} groups reached a trainer since version "
                           f"{self.state.version} (the last: {why}); the run cannot make progress")

    def _on_dropped(self, worker: WorkerProcess, m: msg.SamplesDropped) -> None:
        """The staleness policy dropped samples too old to train within η: counted with the tokens they wasted,
        and a group lost whole frees its slot for another."""
        reason = f"{m.node}: {m.reason}"
        self._free(self.accounting.on_dropped(m.sample_ids, m.tokens, reason), reason)
        self.metrics.write({"kind": "dropped", "sample_ids": m.sample_ids, "tokens": sum(m.tokens), "reason": reason,
                            "wall_s": self._elapsed()})

    def _on_noted(self, worker: WorkerProcess, m: msg.SamplesNoted) -> None:
        self.accounting.on_noted(m.sample_ids, m.reasons)

    def _on_eval(self, worker: WorkerProcess, m: msg.HeldOutScored) -> None:
        record = self.heldout.scored(m.round, m.sample_ids, m.rewards, m.solved) if self.heldout is not None else None
        if record is not None:
            self._eval_done(record)

    def _on_checkpoint(self, worker: WorkerProcess, m: msg.CheckpointWritten) -> None:
        self.sealing.part_written(m.path, m.model, m.version, m.next_group, m.consumed, self._checkpoint_state)

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
                            "wall_s": self._elapsed()})
        self._reissue(only=set(groups))

    def _on_metrics(self, worker: WorkerProcess, m: msg.NodeMetrics) -> None:
        self.steps.on_metrics(m.values)

    def _on_error(self, worker: WorkerProcess, m: msg.WorkerError) -> None:
        where = f"node '{m.node}'" if m.node else f"worker {worker.worker_id}"
        prefix = "" if m.message.startswith(("node '", "recipe")) or ": node '" in m.message else f"{where}: "
        worker.last_error = f"{prefix}{m.message}"
        worker.fatal = m.fatal
        log.error("%s reported: %s", worker.worker_id, worker.last_error)

    # -- faults ---------------------------------------------------------------------------

    def _check_processes(self) -> None:
        now = time.monotonic()
        for w in list(self.workers.values()):
            code = w.process.poll()
            if code is None and w.ready and now - w.last_seen > self.config.faults.dead_after_s:
                why = f"was silent for {now - w.last_seen:.0f} s (no heartbeat)"
                w.process.kill()
            elif code is not None and not self._stopping:
                self._listen(200)  # its last words (an "error" event) may still be in flight
                why = f"exited with code {code}"
            else:
                continue
            self._on_worker_death(w, why)

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
        self.metrics.write({"kind": "restart", "worker": w.worker_id, "why": cause, "wall_s": self._elapsed()})
        self._spawn(w.pool, w.replica)
        self._census()

    def _elapsed(self) -> float:
        return max(time.monotonic() - self.state.started_at, 1e-9)


HANDLERS: dict[type[msg.Message], Callable[[Controller, WorkerProcess, Any], None]] = {
    msg.Alive: Controller._on_alive,
    msg.Ready: Controller._on_ready,
    msg.Heartbeat: Controller._on_heartbeat,
    msg.Census: Controller._on_census,
    msg.Stopped: Controller._on_heartbeat,
    msg.VersionPublished: Controller._on_version,
    msg.SamplesFailed: Controller._on_failed,
    msg.SamplesFiltered: Controller._on_filtered,
    msg.SamplesDropped: Controller._on_dropped,
    msg.SamplesNoted: Controller._on_noted,
    msg.HeldOutScored: Controller._on_eval,
    msg.CheckpointWritten: Controller._on_checkpoint,
    msg.DuplicateDropped: Controller._on_duplicate,
    msg.BatchRefused: Controller._on_rejected,
    msg.NodeMetrics: Controller._on_metrics,
    msg.WorkerError: Controller._on_error,
}


def _remove_socket_files(plan: Plan) -> None:
    """Every ipc socket file of the run: a worker killed by a signal never removes the one it bound."""
    for endpoint in plan.bound_endpoints():
        if endpoint.startswith("ipc://"):
            Path(endpoint.removeprefix("ipc://")).unlink(missing_ok=True)

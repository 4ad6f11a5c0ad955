"""The controller: starts the workers, feeds the source through the staleness gate, and answers events.

This module is the event loop. What it decides with lives next to it: admission (the source
and the gate), versions (one per trained model, and what followers hold), evaluation (held-out
rounds), faults (what a dead worker gets), checkpoint (sealing what the trainers wrote),
accounting (where every sample is). Workers' messages are typed (messages.py) and dispatched
by class through `HANDLERS`, to handlers here and in its two mixins: reports.py
(reports of work) and recovery.py (a dead worker: restart, census, re-issue). On an
ending signal (signals.py) or a worker's error it stops every worker, asks the trainers for a
final checkpoint when the run is healthy, and kills whatever is left by pid.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from areal.config import RunConfig
from areal.errors import ConfigError, RunError, WireError
from areal.graph.batch import Batch
from areal.graph.graph import Graph
from areal.graph.meta import GroupMeta
from areal.runtime.compiler.plan import Plan
from areal.runtime.controller.accounting import Accounting
from areal.runtime.controller.faults import Restarts
from areal.runtime.controller.placement import launcher_for, weights_landing, worker_spec
from areal.runtime.controller.recovery import WorkerRecovery
from areal.runtime.controller.reports import WorkerReports
from areal.runtime.controller.run_state import RunState, WorkerProcess
from areal.runtime.controller.signals import EndingSignals
from areal.runtime.controller.wiring import Wiring
from areal.runtime.records.evaluation import HeldOut, first_pass
from areal.runtime.records.metrics import MetricsWriter
from areal.runtime.records.sample_log import SampleLog
from areal.runtime.records.steps import StepRecorder
from areal.runtime.staleness.admission import Admission, configured
from areal.runtime.staleness.policies import policy_named
from areal.runtime.storage.checkpoint import Sealing, final_dir, staging_dir
from areal.runtime.storage.resume import RECIPE_COPY
from areal.runtime.storage.rundir import RunDirLock, WriteFailed, write_atomically, writing
from areal.runtime.weights.hosts import auto_transport, require_one_host
from areal.runtime.weights.versions import Versions
from areal.runtime.wire import messages as msg
from areal.runtime.wire.channels import is_dynamic, private_folder
from areal.runtime.wire.commands import Stop
from areal.runtime.wire.control import ControlServer, Pulse
from areal.runtime.wire.security import RunKey
from areal.runtime.worker.outbox import Outbox

log = logging.getLogger("areal.controller")

STOP_TIMEOUT_S = 60.0


class Controller(WorkerReports, WorkerRecovery):
    def __init__(self, plan: Plan, graph: Graph, config: RunConfig, *, saved: dict[str, Any] | None = None,
                 resume_dir: Path | None = None, on_event: Callable[[Controller], None] | None = None,
                 lock: RunDirLock | None = None) -> None:
        """`saved` is a checkpoint's controller.json when resuming: versions, source cursor, accounting; `lock`
        holds the run directory (rundir.py), released when the run ends."""
        self.plan, self.graph, self.config = plan, graph, config
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
                                   done=frozenset(set.intersection(*consumed) if consumed else ()),
                                   slack=config.drop_slack)
        self.versions = Versions(plan, start_version, config.sampling_lag, resumed=resume_dir)
        self.trainers = [p.name for p in plan.trainer_pools()]
        self.next_group = {t: next_groups.get(t, start_group) for t in self.trainers}
        self.taken: dict[str, set[int]] = {t: set() for t in self.trainers}  # consumed above the frontier, each
        self.staleness_policy = policy_named(config.staleness_policy, config.recycle_keep_prefix)
        self.accounting = Accounting(config.group_size, counted=plan.policy or next(iter(self.trainers), ""),
                                     started_groups=start_group)
        if saved:
            self.accounting.trained = set(saved.get("trained_ids", []))
            self.accounting.failed = {int(k): v for k, v in saved.get("failed", {}).items()}
            self.accounting.filtered = {int(k): v for k, v in saved.get("filtered", {}).items()}
            self.accounting.dropped = {int(k): v for k, v in saved.get("dropped", {}).items()}
            self.accounting.noted = {int(k): v for k, v in saved.get("noted", {}).items()}
            counts = saved.get("accounting", {})  # the re-queues so far: a count, not a verdict
            self.accounting.recycled = int(counts.get("recycled", 0))
            self.accounting.recycled_tokens = int(counts.get("recycled_tokens", 0))
        heldout = configured(graph.heldout.get(self.source_node.name), config)
        # the same held-out tasks every round, so pass@1 is comparable across versions
        self.heldout = (HeldOut(first_pass(heldout, config.eval.tasks), config.eval.samples,
                                first_round=int(saved.get("eval_round", 0)) if saved else 0)
                        if heldout is not None and config.eval.tasks else None)
        self.state = RunState(version=start_version, steps=config.steps)
        self.wall_before = float(saved.get("wall_s", 0.0)) if saved else 0.0  # the run's seconds at its checkpoint
        self.metrics = MetricsWriter.for_run(self.run_dir, config, saved, start_version)
        # the samples' fate where the controller decides it: admitted, or dropped by the staleness policy
        self.sample_log = SampleLog(self.run_dir, "controller", config.records) if config.records.samples else None
        self.steps = StepRecorder(len(self.accounting.trained), config.group_size, len(self.trainers) > 1,
                                  (plan.solved_field, plan.solved_at))  # a resumed run's rates: its own work
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
        if self.plan.weights_transport == "auto":  # Ray: decided by where the pools' replicas are reserved
            landed = weights_landing(self.plan, self.config.cluster)
            self.plan = dataclasses.replace(self.plan, weights_transport=auto_transport(
                self.plan, landed, self.config.cluster.shared_dir))
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
                self.metrics.close(failed=not (error is None or isinstance(error, KeyboardInterrupt)))
                if self.sample_log is not None:
                    self.sample_log.close()
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
            process = launcher_for(self.config.cluster, self.plan).start(launch)
        except OSError as err:  # its log cannot be opened: a run directory made read-only, a full disk
            raise RunError(f"cannot start {worker_id}: {err.strerror} ({err.filename or log_path}); a run needs "
                           f"its directory {self.run_dir} writable to the end") from None
        earlier = self.workers.get(worker_id)  # a restart: the CPU its predecessors used stays the worker's
        self.workers[worker_id] = WorkerProcess(worker_id, pool, replica, process, log_path,
                                                cpu_s_before=earlier.cpu_total if earlier else 0.0,
                                                replacement=earlier is not None)
        self._check_hosts()

    def _check_hosts(self) -> None:
        """shm: every follower on its trainer's host, checked as each lands, before it could ask for a segment."""
        require_one_host(self.plan, [(w.pool, w.replica, w.process.host) for w in self.workers.values()
                                     if w.process.host])

    def _await_ready(self) -> None:
        deadline = time.monotonic() + (limit := self.config.faults.ready_timeout_s)
        while not all(w.ready for w in self.workers.values()):
            if time.monotonic() > deadline:
                late = [w.worker_id for w in self.workers.values() if not w.ready]
                waits = [why for w in self.workers.values() if (why := w.process.waiting())]
                raise RunError(f"workers not ready after {limit:.0f} s (faults.ready_timeout_s): {', '.join(late)}"
                               + "".join(f"\n  {why}" for why in waits))
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
                self._end_training()  # before the last held-out round: it judges the policy the run ends with
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
            if not w.ready:  # its setup never returned: it reads no command, and has nothing to save
                w.process.kill()
            trainer = self.plan.pool(w.pool).role == "train"
            self.control.send(w.worker_id, Stop(checkpoint=str(checkpoint) if checkpoint and trainer else None))
        deadline = time.monotonic() + STOP_TIMEOUT_S
        unwritten = None
        while time.monotonic() < deadline:
            # a worker sends its checkpoint and "stopped" just before it exits: once every process is gone, one
            # more listen reads what they sent last, then nothing more can come
            gone = all(w.process.poll() is not None for w in self.workers.values())
            try:
                self._listen(100)
            except RunError as err:
                log.error("while stopping: %s", err)
                if isinstance(err, WriteFailed):
                    unwritten = unwritten or err
            if gone:
                break
        for w in self.workers.values():
            if w.process.poll() is None:
                log.warning("killing %s (pid %d): it did not stop within %.0f s", w.worker_id, w.process.pid,
                            STOP_TIMEOUT_S)
            w.process.kill()
        self.state.status = "stopped"
        self.on_event(self)
        return unwritten or self._unsealed(checkpoint)

    # -- the source -----------------------------------------------------------------------

    def _admit(self) -> None:
        if self._stopping:
            return
        for batch, meta in self.admission.admit(self.versions.slowest, self.versions.sampled()):
            self._send_source(batch, meta)
            if self.sample_log is not None:
                self.sample_log.admitted(meta.group, meta.samples, batch.size, meta.admitted_at)
        self.accounting.started_groups = self.admission.gate.started  # groups consumed before a resume too
        for problem in self.admission.new_problems():
            log.warning("skipped a task record: %s", problem)
            self.metrics.write({"kind": "bad_task", "problem": problem, "wall_s": self._wall()})
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

    # -- evaluation -----------------------------------------------------------------------

    def _start_eval(self) -> None:
        assert self.heldout is not None
        # the policy the generators sample with (in lagged mode, not the trainer's newest)
        for batch, meta in self.heldout.start(self.versions.sampled(), self.admission.task_batch):
            self._send_source(batch, meta)

    def _eval_done(self, record: dict[str, Any]) -> None:
        record["wall_s"] = self._wall()
        self.state.evals.append(record)
        for line in [record, *self.steps.warnings(record)]:
            self.metrics.write(line)

    # -- events ---------------------------------------------------------------------------

    def _listen(self, timeout_ms: int) -> None:
        got = self.control.recv(timeout_ms)
        while got is not None:
            self._handle(*got)
            got = self.control.recv(0)

    def _handle(self, sender: str, raw: dict[str, Any]) -> None:
        worker = self.workers.get(sender.removesuffix(Pulse.SUFFIX))  # a pulse comes from its worker's pulse thread
        if worker is None:
            if not sender.endswith(Pulse.SUFFIX):
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
        """A pulse: the node call its worker has been in for long, logged as it is first said, shown while it lasts."""
        if m.long_call and not worker.long_call:
            log.warning("%s: %s", worker.worker_id, m.long_call)
            self.state.long_calls.append(f"{worker.worker_id}: {m.long_call}")
        worker.long_call = m.long_call

    def _on_ready(self, worker: WorkerProcess, m: msg.Ready) -> None:
        worker.ready = True
        self._check_hosts()  # under Ray its host is known once Ray placed it
        # a replacement under Ray: groups dealt to its predecessor's endpoint while it was down (a lost node may
        # take minutes to come back) went with the disconnect, after the census at its death; a census again
        if self._dynamic and self.wiring.wire(worker, m.endpoints, self.workers.values()) and not self._stopping:
            self._census()
        self.versions.catch_up(worker, self.control.send)

    def _on_heartbeat(self, worker: WorkerProcess, m: msg.Heartbeat | msg.Stopped) -> None:
        worker.busy = getattr(m, "busy", worker.busy)
        worker.cpu_s = m.cpu_s
        worker.holding = set(getattr(m, "holding", worker.holding))
        worker.counts = {"batches": m.batches, "samples": m.samples, "tokens": m.tokens}

    def _elapsed(self) -> float:  # seconds since this process's workers were ready: what its rates are over
        return max(time.monotonic() - self.state.started_at, 1e-9)

    def _wall(self, elapsed: float | None = None) -> float:
        """A metrics line's wall_s: a resumed run's goes on from its checkpoint's; `elapsed`: this process's."""
        return self.wall_before + (self._elapsed() if elapsed is None else elapsed)


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
    msg.GroupsRecycled: Controller._on_recycled,
    msg.SamplesNoted: Controller._on_noted,
    msg.HeldOutScored: Controller._on_eval,
    msg.CheckpointWritten: Controller._on_checkpoint,
    msg.FileWritten: Controller._on_file,
    msg.DuplicateDropped: Controller._on_duplicate,
    msg.BatchRefused: Controller._on_rejected,
    msg.NodeMetrics: Controller._on_metrics,
    msg.WorkerError: Controller._on_error,
    msg.TrainingEnded: Controller._on_training_ended,
}


def _remove_socket_files(plan: Plan) -> None:
    """Every ipc socket file of the run: a worker killed by a signal never removes the one it bound."""
    for endpoint in plan.bound_endpoints():
        if endpoint.startswith("ipc://"):
            Path(endpoint.removeprefix("ipc://")).unlink(missing_ok=True)

"""The controller: starts the workers, feeds the source through the staleness gate, listens.

It owns the run's truth: the current policy version, where every sample is (accounting), the
metrics stream, evaluation rounds and shutdown. It never runs a node's code except the source's
iterator. On Ctrl-C, SIGTERM or a worker's error it stops every worker, asks the trainer for a
final checkpoint when the run is healthy, and kills whatever is left by pid.
"""

from __future__ import annotations

import logging
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from areal.config import RunConfig
from areal.errors import ConfigError, RunError
from areal.graph.batch import Batch
from areal.graph.graph import Graph
from areal.graph.meta import GroupMeta
from areal.runtime.accounting import Accounting
from areal.runtime.channels import BatchSender, is_dynamic, private_folder
from areal.runtime.checkpoint import final_dir, prune, seal, staging_dir
from areal.runtime.codec import FrameTooLarge, encode
from areal.runtime.control import ControlServer, Pulse
from areal.runtime.metrics import MetricsWriter
from areal.runtime.placement import WorkerHandle, launcher_for, worker_spec
from areal.runtime.plan import Plan
from areal.runtime.security import RunKey
from areal.runtime.staleness import StalenessGate

log = logging.getLogger("areal.controller")

READY_TIMEOUT_S = 600.0  # a worker may build the warm-start model on first use
STOP_TIMEOUT_S = 60.0
EVAL_ROUND_IDS = 1_000_000  # held-out sample ids of round r: -(r * EVAL_ROUND_IDS + i) - 1 (config caps i)


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

    version: int = 0
    steps: int = 0
    started_at: float = field(default_factory=time.monotonic)
    last_step: dict[str, Any] = field(default_factory=dict)
    evals: list[dict[str, Any]] = field(default_factory=list)
    staleness: Counter[int] = field(default_factory=Counter)
    trained_tokens: int = 0
    startup_s: float = 0.0
    status: str = "starting"


class Controller:
    def __init__(self, plan: Plan, graph: Graph, config: RunConfig, *, saved: dict[str, Any] | None = None,
                 resume_dir: Path | None = None, on_event: Callable[[Controller], None] | None = None) -> None:
        """`saved` is a checkpoint's controller.json when resuming: version, source cursor, accounting."""
        self.plan = plan
        self.graph = graph
        self.config = config
        self.run_dir = Path(plan.run_dir)
        self.resume_dir = resume_dir
        self.on_event = on_event or (lambda _: None)
        source_pool = plan.pools[0]
        self.source_node = graph.nodes[source_pool.nodes[0]]
        self.tasks = _configured(self.source_node.spec.instantiate(), config)
        start_version = int(saved["version"]) if saved else 0
        if saved and config.sampling_lag:
            raise ConfigError("mode=lagged: a run cannot resume (the checkpoint holds the newest policy, not the "
                              "lagged ones the generators sample from); start it again")
        if saved and saved.get("source"):
            self.tasks.restore(saved["source"])
        heldout = _configured(graph.heldout.get(self.source_node.name), config)
        # the same held-out tasks every round, so pass@1 is comparable across versions
        self.heldout = _first_tasks(heldout, config.eval.tasks) if heldout is not None else None
        self.group_size = config.group_size
        self.state = RunState(version=start_version, steps=config.steps)
        started = start_version * config.batch_size  # after a resume: i·B, never the old count
        self.gate = StalenessGate(config.batch_size, config.admission_staleness, started=started)
        self.accounting = Accounting(config.batch_size, config.group_size, started_groups=started)
        if saved:
            self.accounting.trained = set(saved.get("trained_ids", []))
            self.accounting.failed = {int(k): v for k, v in saved.get("failed", {}).items()}
            self.accounting.noted = {int(k): v for k, v in saved.get("noted", {}).items()}
        self.source_snapshots: dict[int, dict[str, Any]] = {}
        self.metrics = MetricsWriter(self.run_dir / "metrics.jsonl",
                                     keep_lines=int(saved.get("metrics_lines", 0)) if saved else None)
        self._trained_before = len(self.accounting.trained)  # a resumed run's rates count only its own work
        self.workers: dict[str, WorkerProcess] = {}
        self._task_iter: Iterator[dict[str, Any]] | None = None
        self._eval_round = int(saved.get("eval_round", 0)) if saved else 0
        self._eval_pending: dict[int, dict[str, Any]] = {}
        self._stopping = False
        self.bad_tasks: list[str] = []
        self.skipped_tasks = 0
        self._issued: dict[int, tuple[Batch, GroupMeta]] = {}  # admitted, not yet trained: for re-issue
        self._eval_sent: dict[int, tuple[Batch, GroupMeta]] = {}
        self.oversized_tasks = 0  # task records too large to ever send, skipped
        self._warned_zero_advantage = False
        self._restarts: dict[str, list[float]] = {}
        self._plan_path = self.run_dir / "plan.json"
        self._latest_path: str | None = None  # newest published weights file
        # lagged mode: generators hold the policy this many versions behind; 0 once training is over
        self._sampling_lag = config.sampling_lag
        self._told_version: int | None = None  # the policy version generators were last sent
        # Ray: workers bind where they land and say where (areal.runtime.channels.is_dynamic)
        self._dynamic = any(is_dynamic(p.endpoints) for p in plan.pools)
        self._listening: dict[str, str] = {}  # worker id -> the data endpoint it bound

    # -- lifecycle ----------------------------------------------------------------------

    def run(self) -> RunState:
        private_folder(self.run_dir / "sockets")
        (self.run_dir / "logs").mkdir(exist_ok=True)
        plan_path = self.run_dir / "plan.json"
        plan_path.write_text(self.plan.to_json())
        (self.run_dir / "config.json").write_text(self.config.model_dump_json(indent=2) + "\n")
        key = None
        if self.plan.secured:  # TCP: the workers read the key the controller makes for this run
            key = RunKey.create()
            key.write(self.run_dir)
        self.control = ControlServer(self.plan.control_endpoint, key)
        first = self.plan.pools[1]
        self.source_out = BatchSender(None if self._dynamic else first.endpoints[0], bind=False, key=key,
                                      **self.plan.sender_limits())
        for endpoint in () if self._dynamic else first.endpoints[1:]:
            self.source_out.socket.connect(endpoint)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        error: BaseException | None = None
        try:
            self._spawn_all(plan_path)
            self._await_ready()
            self.state.startup_s = time.monotonic() - self.state.started_at
            self.state.started_at = time.monotonic()  # throughput counts from here: startup is reported apart
            self.state.status = "running"
            self._loop()
        except BaseException as err:
            error = err
        finally:
            self._shutdown(healthy=error is None or isinstance(error, KeyboardInterrupt))
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.source_out.close()
            self.control.close()
            self.metrics.close()
            _remove_socket_files(self.plan)
        if error is not None:
            raise error
        return self.state

    def _on_signal(self, signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    def _spawn_all(self, plan_path: Path) -> None:
        for pool in self.plan.pools[1:]:
            for replica in range(pool.replicas):
                self._spawn(plan_path, pool.name, replica)

    def _spawn(self, plan_path: Path, pool: str, replica: int) -> None:
        worker_id = f"{pool}[{replica}]"
        log_path = self.run_dir / "logs" / f"{pool}-{replica}.log"
        version = self._sampled_version() if self._receives_weights(pool) else self.state.version
        spec = worker_spec(self.plan, plan_path, pool, replica, version, self.resume_dir, log_path)
        try:
            process = launcher_for(self.config.cluster).start(spec)
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
            if limit is not None and time.monotonic() - self.state.started_at > limit:
                log.info("max_minutes reached at version %d", self.state.version)
                break
        if self.heldout is not None and self.state.version > 0:
            self._sampling_lag = 0  # training is over: the last held-out round judges the trained policy
            self._update_generators()
            self._start_eval()
            self._drain_evals(timeout_s=300)

    def _shutdown(self, healthy: bool) -> None:
        self._stopping = True
        self.state.status = "stopping"
        self.on_event(self)
        # the exit checkpoint, unless this version has one already (a finished checkpoint is never rewritten)
        checkpoint = None
        if healthy and self.state.version > 0 and not final_dir(self.run_dir, self.state.version).exists():
            checkpoint = staging_dir(self.run_dir, self.state.version)
        trainer_pool = next((p.name for p in self.plan.pools if p.role == "train"), None)
        for w in self.workers.values():
            fields = {"checkpoint": str(checkpoint)} if checkpoint and w.pool == trainer_pool else {}
            self.control.send(w.worker_id, "stop", **fields)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while any(w.process.poll() is None for w in self.workers.values()) and time.monotonic() < deadline:
            try:
                self._listen(100)
            except RunError as err:
                log.error("while stopping: %s", err)
        for w in self.workers.values():
            if w.process.poll() is None:
                log.warning("killing %s (pid %d): it did not stop within %.0f s", w.worker_id, w.process.pid,
                            STOP_TIMEOUT_S)
            _kill_group(w.process)
        self.state.status = "stopped"

    # -- the source -----------------------------------------------------------------------

    def _admit(self) -> None:
        while not self._stopping and self.gate.allows(self.state.version):
            group = self.gate.started
            if group % self.config.batch_size == 0:
                self.source_snapshots[group // self.config.batch_size] = self._source_state()
            task = self._next_task()
            self._report_bad_tasks()
            # admitted_at: the generator must hold this version's weights before it samples the group
            meta = GroupMeta(group=group, samples=self.group_size, admitted_at=self._sampled_version())
            batch = self._task_batch([task], [group])
            try:
                encode(batch, meta.to_wire(), max_frame_bytes=self.plan.max_frame_bytes,
                       max_header_bytes=self.plan.max_header_bytes)
            except FrameTooLarge as err:  # a record that could never be sent: skipped like a malformed one
                self._skip_task(task, str(err))
                continue
            self.gate.try_start(self.state.version)
            self.accounting.started_groups += 1
            self._issued[group] = (batch, meta)
            self._send_source(batch, meta)

    def _next_task(self) -> dict[str, Any]:
        if self._task_iter is None:
            self._task_iter = iter(self.tasks)
        try:
            return next(self._task_iter)
        except StopIteration:
            self._task_iter = iter(self.tasks)  # a finite source replays: a new epoch
            try:
                return next(self._task_iter)
            except StopIteration:
                raise RunError(f"{self.source_node.describe()}: the task source is empty") from None

    def _report_bad_tasks(self) -> None:
        """Malformed task records the source skipped: each is logged and written to the metrics."""
        problems = getattr(self.tasks, "problems", [])
        for problem in problems[len(self.bad_tasks):]:
            log.warning("skipped a task record: %s", problem)
            self.metrics.write({"kind": "bad_task", "problem": problem, "wall_s": self._elapsed()})
            self.bad_tasks.append(problem)
        self.skipped_tasks = int(getattr(self.tasks, "skipped", len(self.bad_tasks)))

    def _source_state(self) -> dict[str, Any]:
        return self.tasks.state() if hasattr(self.tasks, "state") else {}

    def _task_batch(self, tasks: list[dict[str, Any]], groups: list[int]) -> Batch:
        fields: dict[str, Any] = {}
        for port in self.source_node.outputs:
            if port in ("sample_id", "group_id"):
                continue
            try:
                fields[port] = [task[port] for task in tasks]
            except KeyError:
                raise RunError(f"{self.source_node.describe()}: a task has no field '{port}' "
                               f"(it has: {', '.join(tasks[0])})") from None
        ids = torch.tensor(groups, dtype=torch.int64)
        fields["group_id"] = ids
        fields["sample_id"] = ids.clone()
        return Batch(fields)

    def _skip_task(self, task: dict[str, Any], why: str) -> None:
        name = f"task {task['task_id']!r}" if "task_id" in task else "a task"
        problem = f"{self.source_node.describe()}: skipped {name}: {why}"
        log.warning("%s", problem)
        self.metrics.write({"kind": "bad_task", "problem": problem, "wall_s": self._elapsed()})
        self.bad_tasks.append(problem)
        self.oversized_tasks += 1

    def _send_source(self, batch: Batch, meta: GroupMeta) -> None:
        while True:
            try:
                self.source_out.send(batch, meta.to_wire(), timeout_ms=200)
                return
            except TimeoutError:
                self._listen(0)
                self._check_processes()

    # -- evaluation -----------------------------------------------------------------------

    def _start_eval(self) -> None:
        tasks = self.heldout or []
        round_id = self._eval_round
        self._eval_round += 1
        # negative ids keep held-out samples apart from training samples
        # each held-out task repeated `eval.samples` times, every copy its own one-sample group
        tasks = [task for task in tasks for _ in range(self.config.eval.samples)]
        groups = [-(round_id * EVAL_ROUND_IDS + i) - 1 for i in range(len(tasks))]
        version = self._sampled_version()  # the policy the generators sample with, not the trainer's in lagged mode
        self._eval_pending[round_id] = {"version": version, "n": len(tasks), "rewards": {},
                                        "failed": set(), "started": time.monotonic()}
        meta = GroupMeta(group=groups[0], samples=1, admitted_at=version, eval=True, round=round_id,
                         task_ids=tuple(str(t.get("task_id", i)) for i, t in enumerate(tasks)))
        batch = self._task_batch(tasks, groups)
        self._eval_sent[round_id] = (batch, meta)
        self._send_source(batch, meta)

    def _drain_evals(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self._eval_pending and time.monotonic() < deadline:
            self._listen(100)
            self._check_processes()

    def _eval_done(self, round_id: int) -> None:
        pending = self._eval_pending.pop(round_id)
        self._eval_sent.pop(round_id, None)
        rewards = list(pending["rewards"].values())
        passed = sum(1 for r in rewards if r >= 1.0 - 1e-9)
        record = {"kind": "eval", "round": round_id, "version": pending["version"],
                  "tasks": pending["n"] // self.config.eval.samples, "samples": pending["n"],
                  "pass@1": passed / max(pending["n"], 1), "reward_mean": sum(rewards) / max(pending["n"], 1),
                  "failed": len(pending["failed"]), "wall_s": self._elapsed()}
        self.state.evals.append(record)
        self.metrics.write(record)
        self.on_event(self)

    # -- events ---------------------------------------------------------------------------

    def _listen(self, timeout_ms: int) -> None:
        got = self.control.recv(timeout_ms)
        while got is not None:
            self._handle(*got)
            got = self.control.recv(0)

    def _handle(self, sender: str, message: dict[str, Any]) -> None:
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
        kind = message["type"]
        if kind == "ready":
            worker.ready = True
            if self._dynamic:
                self._wire(worker, message.get("endpoint"))
            if self._receives_weights(worker.pool):
                # a (re)started generator must not sample before it holds the policy it is to sample with
                version = self._sampled_version()
                self.control.send(worker.worker_id, "weights", version=version, path=self._weights_path(version))
        elif kind in ("heartbeat", "stopped"):
            worker.busy = float(message.get("busy", worker.busy))
            worker.holding = {int(g) for g in message.get("holding", [])}
            worker.counts = {k: int(v) for k, v in message.items() if k in ("batches", "samples", "tokens")}
        elif kind == "version":
            self._on_version(message)
        elif kind == "failed":
            self._on_failed(message)
        elif kind == "eval":
            self._on_eval(message)
        elif kind == "checkpoint":
            self._on_checkpoint(message)
        elif kind == "duplicate":
            self.accounting.duplicates += 1
        elif kind == "rejected":
            self._on_rejected(sender, message)
        elif kind == "noted":  # an over-long or empty generation: counted, and it trains on
            self.accounting.on_noted([int(s) for s in message["sample_ids"]], [str(r) for r in message["reasons"]])
        elif kind == "error":
            where = f"node '{message['node']}'" if message.get("node") else f"worker {sender}"
            text = str(message.get("message", ""))
            prefix = "" if text.startswith(("node '", "recipe")) or ": node '" in text else f"{where}: "
            worker.last_error = f"{prefix}{text}"
            worker.fatal = bool(message.get("fatal"))
            log.error("%s reported: %s", sender, worker.last_error)

        self.on_event(self)

    def _on_version(self, message: dict[str, Any]) -> None:
        version = int(message["version"])
        self.state.version = version
        self.accounting.on_trained([int(s) for s in message.get("sample_ids", [])])
        for group in [g for g in self._issued if g < version * self.config.batch_size]:
            del self._issued[group]
        self.accounting.check(version)
        hist = {int(k): int(v) for k, v in message.get("staleness", {}).items()}
        self.state.staleness.update(hist)
        self.state.trained_tokens += int(message.get("tokens", 0))
        rewards = message.get("rewards", [])
        elapsed = self._elapsed()
        record = {
            "kind": "step", "version": version, "wall_s": elapsed,
            "reward_mean": sum(rewards) / len(rewards) if rewards else None,
            "solved": sum(1 for r in rewards if r >= 1.0 - 1e-9) / len(rewards) if rewards else None,
            "samples": len(rewards), "trained_samples": len(self.accounting.trained),
            "samples_per_s": (len(self.accounting.trained) - self._trained_before) / elapsed,
            "generated_tokens_per_s": self._generated_tokens() / elapsed,
            "trained_tokens_per_s": self.state.trained_tokens / elapsed,
            "staleness": {str(k): v for k, v in sorted(hist.items())},
            "busy": {w.worker_id: round(w.busy, 3) for w in self.workers.values()},
            **self.accounting.summary(version),
            **{k: v for k, v in message.get("stats", {}).items() if isinstance(v, (int, float))},
        }
        self.state.last_step = record
        self.metrics.write(record)
        if record.get("zero_advantage") == 1.0 and not self._warned_zero_advantage:
            self._warned_zero_advantage = True
            warning = (f"every advantage of step {version} is 0: the update cannot move the policy (group_size="
                       f"{self.group_size} with a group-normalised advantage, or every group's rewards equal?)")
            log.warning("%s", warning)
            self.metrics.write({"kind": "warning", "version": version, "warning": warning, "wall_s": elapsed})
        if message.get("path") or message.get("broadcast"):
            self._latest_path = message.get("path")
            self._update_generators(broadcast=bool(message.get("broadcast")))
        every = self.config.eval.interval_steps
        if self.heldout is not None and every and version % every == 0 and version < self.state.steps:
            self._start_eval()

    def _wire(self, worker: WorkerProcess, endpoint: str | None) -> None:
        """Dynamic endpoints: point the pool before `worker` at the endpoint it bound (instead of the one
        of the process it replaces), and `worker` at every endpoint the pool after it has bound."""
        pools = list(self.plan.pools)
        at = [p.name for p in pools].index(worker.pool)
        if endpoint is not None:  # a trainer rank > 0 binds nothing
            old = self._listening.get(worker.worker_id)
            self._listening[worker.worker_id] = endpoint
            before = pools[at - 1]
            if before.role == "source":
                if old is not None:
                    self.source_out.disconnect(old)
                self.source_out.connect(endpoint)
            for w in self.workers.values():
                if w.pool == before.name and w.ready:
                    self.control.send(w.worker_id, "peers", connect=[endpoint], disconnect=[old] if old else [])
        if at + 1 < len(pools):
            after = [self._listening[w] for w in pools[at + 1].worker_ids() if w in self._listening]
            self.control.send(worker.worker_id, "peers", connect=after)

    def _receives_weights(self, pool: str) -> bool:
        return any(dst == pool for _, dst in self.plan.weights_route)

    def _sampled_version(self) -> int:
        """The policy version generators sample with: the trainer's, or η behind it in lagged mode."""
        return max(0, self.state.version - self._sampling_lag)

    def _weights_path(self, version: int) -> str | None:
        if version == self.state.version:
            return self._latest_path
        older = Path(self.plan.weights_dir) / f"v{version:06d}.safetensors"  # the trainer keeps 3 + lag of them
        return str(older) if older.exists() else None  # none for v0: generators start from the checkpoint

    def _update_generators(self, broadcast: bool = False) -> None:
        """Send every generator the weights it should now sample with, once per version.

        broadcast: the trainer is waiting in the weights group's broadcast of this version, and
        each generator must take its part.
        """
        version = self._sampled_version()
        if version == self._told_version:
            return
        self._told_version = version
        path = self._weights_path(version)
        for w in self.workers.values():
            if self._receives_weights(w.pool):
                self.control.send(w.worker_id, "weights", version=version, path=path, broadcast=broadcast)

    def _on_failed(self, message: dict[str, Any]) -> None:
        ids = [int(s) for s in message.get("sample_ids", [])]
        node = str(message.get("node"))
        reasons = [f"{node}: {r}" for r in message.get("reasons", [])]
        if ids and self.config.faults.nodes.get(node, self.config.faults.policy) == "fail-fast":
            raise RunError(f"node '{node}': sample {ids[0]} failed at version {self.state.version}: "
                           f"{reasons[0].partition(': ')[2]} (faults.policy=fail-fast stops at the first failure)")
        if message.get("eval"):
            for sid in ids:
                round_id = (-sid - 1) // EVAL_ROUND_IDS
                if round_id in self._eval_pending:
                    self._eval_pending[round_id]["failed"].add(sid)
                    self._maybe_eval_done(round_id)
            return
        self.accounting.on_failed(ids, reasons)
        for sid, reason in zip(ids, reasons):
            log.warning("sample %d failed: %s", sid, reason)
            self.metrics.write({"kind": "failed", "sample_id": sid, "reason": reason, "wall_s": self._elapsed()})

    def _on_rejected(self, sender: str, message: dict[str, Any]) -> None:
        """A worker refused a malformed batch: logged with the reason; groups of ours it named are sent again.

        A refused group never reaches the trainer, which waits for every group of its batch, so failing its
        samples would stall the run: re-issuing (as after a crash) keeps every sample's count exact.
        """
        reason = f"refused by {sender}: {message.get('reason', '')}"
        log.warning("%s", reason)
        groups = sorted({int(g) for g in message.get("groups", [])} & self._issued.keys())
        self.metrics.write({"kind": "rejected", "worker": sender, "reason": reason, "groups": groups,
                            "wall_s": self._elapsed()})
        self._reissue(only=set(groups))

    def _on_eval(self, message: dict[str, Any]) -> None:
        round_id = int(message["round"])
        pending = self._eval_pending.get(round_id)
        if pending is None:
            return
        for sid, reward in zip(message.get("sample_ids", []), message.get("rewards", [])):
            pending["rewards"][int(sid)] = float(reward)
        self._maybe_eval_done(round_id)

    def _maybe_eval_done(self, round_id: int) -> None:
        pending = self._eval_pending[round_id]
        if len(pending["rewards"].keys() | pending["failed"]) >= pending["n"]:
            self._eval_done(round_id)

    def _on_checkpoint(self, message: dict[str, Any]) -> None:
        """The trainer wrote its part into a staging folder: add ours, seal it (checkpoint.py), prune old ones."""
        version = int(message["version"])
        closed = version * self.config.batch_size * self.group_size
        state = {
            "source": self.source_snapshots.get(version, self._source_state()),
            "accounting": self.accounting.summary(version),
            "trained_ids": sorted(s for s in self.accounting.trained),
            "failed": {str(k): v for k, v in self.accounting.failed.items() if k < closed},
            "noted": {str(k): v for k, v in self.accounting.noted.items() if k < closed},
            "metrics_lines": self.metrics.lines,
            "eval_round": self._eval_round,
        }
        policy = Path(self.plan.weights_dir) / f"v{version:06d}.safetensors"
        if seal(Path(message["path"]), version, state, policy) is not None:
            prune(self.run_dir, self.config.checkpoint.keep)

    def _check_processes(self) -> None:
        now = time.monotonic()
        for w in list(self.workers.values()):
            code = w.process.poll()
            if code is None and w.ready and now - w.last_seen > self.config.faults.dead_after_s:
                why = f"was silent for {now - w.last_seen:.0f} s (no heartbeat)"
                _kill_group(w.process)
            elif code is not None and not self._stopping:
                self._listen(200)  # its last words (an "error" event) may still be in flight
                why = f"exited with code {code}"
            else:
                continue
            self._on_worker_death(w, why)

    def _on_worker_death(self, w: WorkerProcess, why: str) -> None:
        """Restart the worker and re-issue what it may have held, or stop the run naming the node."""
        nodes = self.plan.pool(w.pool).nodes
        policy = next((self.config.faults.nodes[n] for n in nodes if n in self.config.faults.nodes),
                      self.config.faults.policy)
        window = self.config.faults.window_s
        recent = [t for t in self._restarts.get(w.pool, []) if time.monotonic() - t < window]
        cause = f"worker {w.worker_id} {why}" + (f": {w.last_error}" if w.last_error else "")
        where = f"\n  (log: {w.log_path})\n{_tail(w.log_path)}"
        if w.last_error and (policy == "fail-fast" or not w.ready or w.fatal):
            # a node that failed while setting up fails the same way on every restart: stop now
            when = "" if w.ready else ", while setting up"
            raise RunError(f"{w.last_error}\n  (worker {w.worker_id}{when}; log: {w.log_path})")
        if self.plan.weights_rendezvous and self._receives_weights(w.pool):
            raise RunError(f"{cause}{where}\n  with transport.weights=broadcast a generator cannot rejoin the "
                           f"weights group: continue with `areal run --resume {self.run_dir}`, or run with "
                           f"transport.weights=files, where a generator restarts alone")
        if policy == "fail-fast" or self.plan.pool(w.pool).role == "train":
            raise RunError(f"{cause}{where}" + ("" if policy == "fail-fast" else
                           "\n  the trainer holds the optimizer state: "
                           f"continue with `areal run --resume {self.run_dir}`"))
        if len(recent) >= self.config.faults.max_restarts:
            raise RunError(f"node '{nodes[0]}' keeps failing: {len(recent) + 1} failures within {window:.0f} s, "
                           f"last: {cause}{where}")
        self._restarts[w.pool] = [*recent, time.monotonic()]
        log.warning("%s; restarting it (%d/%d in %.0f s)", cause, len(recent) + 1,
                    self.config.faults.max_restarts, window)
        self.metrics.write({"kind": "restart", "worker": w.worker_id, "why": cause, "wall_s": self._elapsed()})
        self._spawn(self._plan_path, w.pool, w.replica)
        self._reissue()

    def _reissue(self, only: set[int] | None = None) -> None:
        """Send again every admitted group (or those in `only`) the trainer has not gathered; it drops the copies
        it has. Held-out rounds in flight are sent again too, unless `only` names training groups."""
        held = set().union(*(w.holding for w in self.workers.values()))
        for group, (batch, meta) in sorted(self._issued.items()):
            if group not in held and (only is None or group in only):
                self.accounting.reissued += 1
                self._send_source(batch, meta)
        for batch, meta in list(self._eval_sent.values()) if only is None else []:
            self._send_source(batch, meta)

    def _generated_tokens(self) -> int:
        return sum(w.counts.get("tokens", 0) for w in self.workers.values())

    def _elapsed(self) -> float:
        return max(time.monotonic() - self.state.started_at, 1e-9)


def _configured(source: Any, config: RunConfig) -> Any:
    """Sources that depend on the config (`code_tasks`) resolve here; others are used as they are."""
    return source.configure(config) if hasattr(source, "configure") else source


def _kill_group(process: WorkerHandle) -> None:
    """Kill the worker and what it started: its session locally, its actor on Ray."""
    process.kill()


def _remove_socket_files(plan: Plan) -> None:
    """Every ipc socket file of the run: a worker killed by a signal never removes the one it bound."""
    for endpoint in (plan.control_endpoint, *(e for p in plan.pools for e in p.endpoints)):
        if endpoint.startswith("ipc://"):
            Path(endpoint.removeprefix("ipc://")).unlink(missing_ok=True)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join("    " + line for line in path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "    (no log)"


def _first_tasks(source: Any, n: int) -> list[dict[str, Any]]:
    """Up to n tasks of a held-out source, one pass at most: sources replay epochs, so stop where the next begins.

    A source without an `epoch` counter is read until a task_id repeats. Held-out tasks that share a task_id
    are all kept (each is scored), with a warning naming the id: they are probably a mistake in the file.
    """
    tasks: list[dict[str, Any]] = []
    seen: set[str] = set()
    repeated: list[str] = []
    iterator = iter(source)
    first_epoch = getattr(source, "epoch", None)
    while len(tasks) < n:
        task = next(iterator, None)
        if task is None or (first_epoch is not None and source.epoch != first_epoch):
            break
        key = str(task.get("task_id", len(tasks)))
        if key in seen:
            if first_epoch is None:
                break
            repeated.append(key)
        seen.add(key)
        tasks.append(task)
    if repeated:
        log.warning("held-out tasks repeat task_id %s (%s): each is scored, but the ids no longer name one task",
                    ", ".join(map(repr, repeated[:5])), source)
    return tasks

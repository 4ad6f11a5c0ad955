"""One worker process: one replica of one pool. It receives groups on its input channels, runs its nodes,
and sends each group on to every pool that reads from it.

    python -m areal.runtime.worker.main PLAN_JSON POOL REPLICA [VERSION [RESUME_DIR]]

A worker rebuilds its nodes by loading the recipe named in the plan (no code crosses a socket),
then runs the loop of its pool's role:
- map: a group in (joined from every input channel), the nodes run, the group out on every output;
- stream: a generate (or episode) node is stepped one decode step at a time, taking prompts and new
  weights between steps, and each finished group goes through the rest of the pool's nodes; a
  stream node marks samples it could not finish with a per-row FAILED column (reason or None);
- train: groups are taken in the order the staleness policy says (runtime/policies: admission
  order, or the oldest finished first), skipping those left empty (every sample failed or
  filtered), until B are gathered; then the proximal pass and the update run and the trainer's
  model gets its next version. The policy's trainer drops the groups too old to train (drop),
  masks the tokens too old (token, recycle) and re-checks its guarantee on what the update reads;
  a generator re-queues the groups it started more than η versions ago (recycle). A
  trainer of several ranks does this in rank 0, which orders the others to do the same
  (runtime/worker/ranks.py).
Each role's loop is a mixin of its own (map_role.py, stream_role.py, trainer_role.py; an episode node runs
in the stream role); this module is what they share: the commands, the inputs drained and joined, the
groups sent on, and the weights the worker was told to hold.
Every group a pool finishes is sent on every output channel, empty if nothing is left of it, so
joins downstream always complete. A node that raises stops the worker with an "error" event
naming it; the controller decides what happens next.
"""

from __future__ import annotations

import gc
import logging
import os
import resource
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import zmq

from areal.config import RunConfig
from areal.errors import NodeContractError, RunError, WireError
from areal.graph.batch import Batch
from areal.graph.meta import GroupMeta
from areal.graph.node import Node
from areal.graph.recipe import load_recipe
from areal.graph.roles import SetUp
from areal.runtime import weights
from areal.runtime.compiler.plan import Plan
from areal.runtime.records.sample_log import SampleLog
from areal.runtime.records.spans import Spans
from areal.runtime.staleness.policies import policy_named
from areal.runtime.storage.mirror import Mirror, Piece
from areal.runtime.weights import WeightUpdate
from areal.runtime.weights.transport import Source
from areal.runtime.wire import commands as cmd
from areal.runtime.wire import messages as msg
from areal.runtime.wire.channels import BatchReceiver, bind_address
from areal.runtime.wire.codec import FrameTooLarge
from areal.runtime.wire.control import ControlClient, Pulse
from areal.runtime.wire.security import RunKey
from areal.runtime.worker import mismatch
from areal.runtime.worker.chain import LONG_CALLS, Chain, NodeFailure, guard
from areal.runtime.worker.context import WorkerContext
from areal.runtime.worker.cpu_usage import tree_cpu_s
from areal.runtime.worker.join import Join
from areal.runtime.worker.map_role import MapRole
from areal.runtime.worker.outbox import Outbox
from areal.runtime.worker.ranks import RankOrders, rank_environment
from areal.runtime.worker.reaper import guard_process_group
from areal.runtime.worker.stream_role import StreamRole
from areal.runtime.worker.trainer_role import TrainerRole, resumed_consumption

log = logging.getLogger("areal.worker")

SEND_RETRY_MS = 500
JOIN_CAPACITY_BATCHES = 4  # a join holds at most this many steps' worth of groups from an input that is ahead
OPEN_FILES = 65536  # the soft limit on open files a worker asks for (raise_open_files_limit)


class Worker(MapRole, StreamRole, TrainerRole):
    def __init__(self, plan: Plan, pool_name: str, replica: int, version: int, resume_dir: Path | None,
                 control: ControlClient) -> None:
        """`control` is the worker's one control socket: made before anything that can fail, so that even
        an error in a node's setup reaches the controller on it (a second socket with the same identity
        would be refused by the controller's ROUTER)."""
        self.plan = plan
        self.pool = plan.pool(pool_name)
        self.replica = replica
        self.worker_id = f"{pool_name}[{replica}]"
        self.control = control
        self.key = run_key(plan)
        weights.arm(self.key, self._stop_asked)
        # on a node without the run directory: a copy of it here, whose new records, spans and log go back
        self.mirror = Mirror(plan.run_dir, plan.home_run_dir, self.worker_id) if plan.home_run_dir else None
        recipe = load_recipe(plan.recipe, plan.overrides)
        self.config: RunConfig = recipe.config
        self.nodes: list[Node] = [recipe.graph.nodes[name] for name in self.pool.nodes]
        self.impls: list[Any] = []
        if self.pool.rendezvous:  # one rank of a data-parallel trainer: its node's engine joins the group
            rank_environment(self.pool.rendezvous, replica, self.pool.replicas)
        for n in self.nodes:
            impl = n.spec.instantiate()
            if isinstance(impl, SetUp):
                context = WorkerContext(recipe.node_config(n.name), plan, self.pool, replica, n.name, version,
                                        resume_dir, self.control)
                guard(n, impl.setup, context)
            self.impls.append(impl)
        records = self.config.records
        rank_follower = bool(self.pool.rendezvous) and replica > 0  # rank 0 records what its trainer's ranks did
        log = SampleLog(plan.run_dir, self.worker_id, records) if records.samples and not rank_follower else None
        self.spans = Spans(plan.run_dir, self.worker_id, records)  # timed work, for `areal trace` and `areal view`
        self.chain = Chain(self.nodes, self.impls, plan, self.control.send, log, self.spans)
        # map nodes that follow a trained model's weights (a critic's value pass): model -> their impls
        self.followers = {m: [impl for n, impl in zip(self.nodes, self.impls) if recipe.graph.model_of(n) == m]
                          for m in {recipe.graph.model_of(n) for n in self.nodes} - {None, self.pool.name}}
        self.orders = RankOrders() if self.pool.rendezvous else None
        self.follower = self.orders is not None and replica > 0  # gets its steps from rank 0, not a socket
        self.publisher = self._publisher() if self.pool.role == "train" else None
        self.training_ended = False  # told to take no further step (the run's max_minutes)
        self.poller = zmq.Poller()
        self.inboxes: dict[str, BatchReceiver] = {}
        allow_remote = self.config.transport.host != "127.0.0.1"  # asked for
        for channel in plan.inputs_of(pool_name) if not self.follower else []:
            inbox = BatchReceiver(bind_address(channel.endpoints[replica]), bind=True, hwm=plan.high_water_mark,
                                  name=f"'{channel.src}'", max_frame_bytes=plan.max_frame_bytes,
                                  max_header_bytes=plan.max_header_bytes, allow_remote=allow_remote, key=self.key)
            self.inboxes[channel.src] = inbox
            self.poller.register(inbox.socket, zmq.POLLIN)
        levels = {p.name: p.level for p in plan.pools}
        capacity = JOIN_CAPACITY_BATCHES * self.config.batch_size * (self.config.staleness + 1)
        self.join = Join(list(self.inboxes), levels, capacity) if len(self.inboxes) > 1 else None
        self._muted: set[str] = set()  # inputs far ahead of the others, left out of the poll (_listen)
        self.outboxes = {c.dst: Outbox(c, plan, self.key) for c in plan.outputs_of(pool_name)}
        self.poller.register(self.control.socket, zmq.POLLIN)
        self.stopping = False
        self.counts: dict[str, int] = {"batches": 0, "samples": 0, "tokens": 0}
        self._last_beat = time.monotonic()
        self._busy_at_beat = 0.0
        self._latest_weights: dict[str, WeightUpdate] = {}  # model -> the newest weights it was told to hold
        self.holding: set[int] = set()  # trainer: groups gathered for coming steps (not re-issued after a crash)
        self.census: int | None = None  # trainer: the controller asked what it holds (after a crash upstream)
        # trainer: the oldest group not consumed, and those above it a step took (out of admission order)
        self.next_group, self.consumed = resumed_consumption(resume_dir, pool_name)
        self.staleness_policy = policy_named(self.config.staleness_policy, self.config.recycle_keep_prefix)
        self.enforcing = self.pool.role == "train" and pool_name == plan.policy  # its versions count the lags
        # trainer.truncated=mask, the trainer node's own setting: outputs cut at max_new_tokens leave its loss
        self.masks_truncated = self.pool.role == "train" and \
            recipe.node_config(self.nodes[-1].name).trainer.truncated == "mask"
        # the mismatch alarm (mismatch.py): the policy's trainer, where it reads a proximal pass of its own weights
        trainer_config = recipe.node_config(self.nodes[-1].name)
        self.lag0_limit = mismatch.tolerance(trainer_config) if self.enforcing and mismatch.watched(
            trainer_config, self.nodes, plan.binding(self.nodes[-1].name)) else None

    def _publisher(self) -> weights.Publisher:
        """How this trainer's new versions reach their followers (a broadcast's group forms here)."""
        node, trainer = self.nodes[-1], self.impls[-1]
        return weights.publisher(Source(
            model=self.pool.name, plan=self.plan, config=self.config, rank_follower=self.follower,
            gather=partial(guard, node, trainer.policy_weights), save=partial(guard, node, trainer.save_weights),
            weights=getattr(trainer, "weights_kind", "full")))  # a trainer of the researcher's own publishes full

    # -- the shell around the loops -----------------------------------------------------

    def run(self) -> None:
        endpoints = {src: inbox.endpoint for src, inbox in self.inboxes.items()}
        self.control.send(msg.Ready(pid=os.getpid(), endpoints=endpoints))
        LONG_CALLS.floor_s = self.config.faults.long_call_s
        pulse = Pulse(self.plan.control_endpoint, self.worker_id, self.config.faults.heartbeat_s, self.key,
                      long_call=LONG_CALLS.said)
        loop = {"map": self._map_loop, "stream": self._stream_loop, "train": self._train_loop}[self.pool.role]
        try:
            (self._follow_loop if self.follower else loop)()
        finally:
            pulse.stop()
            self.spans.close()
            if self.publisher is not None:
                self.publisher.close()
        self.send_files()
        self.control.send(msg.Stopped(cpu_s=tree_cpu_s(), **self.counts))

    def send_files(self, pieces: Iterable[Piece] | None = None) -> None:
        """On a node without the run directory: what grew in its copy (or `pieces`), to the controller."""
        if self.mirror is not None:
            for piece in self.mirror.changes() if pieces is None else pieces:
                self.control.send(msg.FileWritten(path=piece.path, data=piece.data, fresh=piece.fresh))

    def _wait(self, timeout_ms: int) -> None:
        self._listen()
        self.poller.poll(timeout_ms)
        self._commands()
        now = time.monotonic()
        if now - self._last_beat >= self.config.faults.heartbeat_s:
            busy = (self.chain.busy_s - self._busy_at_beat) / max(now - self._last_beat, 1e-9)
            self.control.send(msg.Heartbeat(busy=busy, cpu_s=tree_cpu_s(), holding=sorted(self.holding),
                                            **self.counts))
            self.send_files()
            self._last_beat, self._busy_at_beat = now, self.chain.busy_s

    def _listen(self) -> None:
        """Poll only the inputs `_drain` reads: one far ahead of the others stays readable, and polling it too spun
        this worker at a whole core until they caught up (a code reward's during every held-out round)."""
        for src, inbox in self.inboxes.items() if self.join is not None else ():
            ahead = self.join.ahead(src)
            if ahead and src not in self._muted:
                self.poller.unregister(inbox.socket)
                self._muted.add(src)
            elif not ahead and src in self._muted:
                self.poller.register(inbox.socket, zmq.POLLIN)
                self._muted.discard(src)

    def _commands(self) -> None:
        """Carry out the controller's commands, each parsed where it enters (a malformed one stops the worker)."""
        while (raw := self.control.recv(0)) is not None:
            command = cmd.parse(raw if self.mirror is None else self.mirror.localised(raw))
            COMMANDS[type(command)](self, command)

    def _stop_asked(self) -> bool:
        """Asked while the worker waits outside its loop (a weights fetch): its commands carried out, stopping?"""
        self._commands()
        return self.stopping

    def _on_stop(self, command: cmd.Stop) -> None:
        self.stopping = True
        if self.pool.role == "train" and command.checkpoint:
            self._checkpoint(Path(command.checkpoint))

    def _on_rewire(self, command: cmd.Rewire) -> None:
        outbox = self.outboxes[command.channel]
        if command.disconnect:
            outbox.disconnect(command.replica, command.disconnect)
        outbox.connect(command.replica, command.connect)

    def _on_census(self, command: cmd.TakeCensus) -> None:
        self.census = command.seq  # answered by the train loop once it has drained what is queued for it

    def _on_end_training(self, command: cmd.EndTraining) -> None:
        self.training_ended = True  # said, with the version, by the train loop between steps

    def _on_frontier(self, command: cmd.ForgetBelow) -> None:
        if self.join is not None:
            self.join.forget_below(command.group)

    def _on_weights(self, command: cmd.HoldWeights) -> None:
        update = command.update
        if weights.collective(update.via):
            # a collective: the trainer waits in it until every generator has taken its part
            with self.spans.timed("weights", "receive weights", model=update.model, version=update.version):
                guard(self.nodes[0], weights.receive, update, self.impls[0])
            update = WeightUpdate(update.model, update.version)  # loaded already: the loop only notes the version
        self._latest_weights[update.model] = update  # otherwise only the newest matters

    def _drain(self) -> list[tuple[Batch, GroupMeta]]:
        """The groups whose every input has come (joined when the pool has several); a batch whose meta is
        malformed is refused and reported, never run. An input that is far ahead of the others waits."""
        got = []
        for src, inbox in self.inboxes.items():
            while not (self.join is not None and self.join.ahead(src)):
                item = inbox.recv(timeout_ms=0)
                if item is None:
                    break
                batch, raw = item
                try:
                    meta = GroupMeta.from_wire(raw, inbox.name)
                except WireError as err:
                    inbox.rejected += 1
                    groups = batch["group_id"].tolist() if isinstance(batch.get("group_id"), torch.Tensor) else []
                    self.control.send(msg.BatchRefused(groups=[int(g) for g in groups], reason=str(err)))
                    continue
                joined = (batch, meta) if self.join is None else self.join.add(src, batch, meta)
                if joined is not None:
                    got.append(joined)
        return got

    def _send(self, batch: Batch, meta: GroupMeta) -> None:
        """Send a finished group on every output channel; one that could never cross the wire fails its samples,
        with the reason, and travels on empty (joins downstream wait for every group)."""
        self.counts["batches"] += 1
        self.counts["samples"] += batch.size
        try:
            for outbox in self.outboxes.values():
                outbox.check(batch, meta)
        except FrameTooLarge as err:
            batch = self.chain.fail(self.nodes[-1], batch, dict.fromkeys(range(batch.size), str(err)), meta.eval)
        for dst, outbox in self.outboxes.items():
            start = time.monotonic()
            while True:
                try:
                    outbox.send(batch, meta, timeout_ms=SEND_RETRY_MS)
                    break
                except TimeoutError:
                    self._wait(0)  # back-pressure: keep answering the controller while downstream is full
                    if self.stopping:
                        return
            self.spans.add("send", f"send to {dst}", start, time.monotonic(), to=dst, group=meta.group,
                           samples=batch.size)

    def _apply_weights(self, model: str) -> WeightUpdate | None:
        """The newest weights `model`'s followers are to hold, if they were told since last asked."""
        return self._latest_weights.pop(model, None)

COMMANDS: dict[type[cmd.Command], Callable[[Worker, Any], None]] = {
    cmd.Stop: Worker._on_stop,
    cmd.Rewire: Worker._on_rewire,
    cmd.TakeCensus: Worker._on_census,
    cmd.ForgetBelow: Worker._on_frontier,
    cmd.HoldWeights: Worker._on_weights,
    cmd.EndTraining: Worker._on_end_training,
}


def raise_open_files_limit() -> int:
    """Lift this process's soft limit on open files to its hard limit (at most OPEN_FILES); the soft limit now.

    An episode worker holds a socket for each agent's connection and a sandbox's pipes for each job: hundreds at
    once in a held-out round, past the 1024 many systems give a process (code_repair_openai failed every episode
    with "Too many open files" under `ulimit -Sn 1024`). The hard limit is the administrator's: never raised."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return soft
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return wanted


def run_key(plan: Plan) -> RunKey | None:
    """The run's key when its sockets are TCP (the controller wrote it before starting any worker)."""
    return RunKey.read(plan.run_dir) if plan.secured else None


def main(argv: list[str]) -> int:
    plan_path, pool_name, replica = argv[0], argv[1], int(argv[2])
    version = int(argv[3]) if len(argv) > 3 else 0
    resume_dir = Path(argv[4]) if len(argv) > 4 else None
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {pool_name}[{replica}] %(levelname)s %(message)s")
    guard_process_group()  # before anything the worker starts: its children die with it
    raise_open_files_limit()
    plan = Plan.from_json(Path(plan_path).read_text())
    torch.set_num_threads(plan.pool(pool_name).threads)
    control = ControlClient(plan.control_endpoint, f"{pool_name}[{replica}]", run_key(plan))
    worker: Worker | None = None
    try:
        worker = Worker(plan, pool_name, replica, version, resume_dir, control)
        # what the worker built to run (its imports, model, engine: ~400k objects) lives as long as it does: frozen,
        # a full collection no longer scans it (0.2 s each, a few a minute in the default run's workers); what setup
        # left as cyclic garbage is collected first, or it would never be
        gc.collect()
        gc.freeze()
        worker.run()
        return 0
    except BaseException as err:  # report everything, even KeyboardInterrupt, before exiting non-zero
        node = err.node if isinstance(err, NodeFailure) else None
        text = str(err) if isinstance(err, (NodeFailure, RunError)) else f"{type(err).__name__}: {err}"
        log.error("%s", traceback.format_exc())
        # a broken contract, or (unless faults.node_errors=restart) an exception in a node's own code, fails the
        # same way on every retry: the controller stops the run instead of restarting the worker
        restartable = worker is not None and worker.config.faults.node_errors == "restart"
        fatal = isinstance(err, NodeContractError) or (isinstance(err, NodeFailure) and not restartable)
        control.send(msg.WorkerError(node=node, message=text, traceback=traceback.format_exc(), fatal=fatal))
        return 1
    finally:
        if worker is not None:
            worker.send_files()  # the log's last lines, the traceback among them
        control.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

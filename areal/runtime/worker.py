"""One worker process: one replica of one pool. It receives groups on its input channels, runs its nodes,
and sends each group on to every pool that reads from it.

    python -m areal.runtime.worker PLAN_JSON POOL REPLICA [VERSION [RESUME_DIR]]

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
  (runtime/ranks.py). The train role's methods live in trainer_role.py.
Every group a pool finishes is sent on every output channel, empty if nothing is left of it, so
joins downstream always complete. A node that raises stops the worker with an "error" event
naming it; the controller decides what happens next.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import zmq

from areal.config import RunConfig
from areal.errors import RunError, WireError
from areal.graph.batch import Batch
from areal.graph.meta import GroupMeta
from areal.graph.node import Node
from areal.graph.recipe import load_recipe
from areal.graph.roles import FAILED
from areal.runtime import commands as cmd
from areal.runtime import messages as msg
from areal.runtime.chain import Chain, NodeFailure, guard
from areal.runtime.channels import BatchReceiver, bind_address
from areal.runtime.checkpoint import MANIFEST
from areal.runtime.codec import FrameTooLarge
from areal.runtime.context import WorkerContext
from areal.runtime.control import ControlClient, Pulse
from areal.runtime.join import Join, expand
from areal.runtime.outbox import Outbox
from areal.runtime.outputs import NodeContractError
from areal.runtime.plan import Plan
from areal.runtime.policies import policy_named
from areal.runtime.ranks import RankOrders, rank_environment
from areal.runtime.reaper import guard_process_group
from areal.runtime.sample_log import SampleLog
from areal.runtime.security import RunKey
from areal.runtime.spans import Spans
from areal.runtime.trainer_role import TrainerRole

log = logging.getLogger("areal.worker")

SEND_RETRY_MS = 500
JOIN_CAPACITY_BATCHES = 4  # a join holds at most this many steps' worth of groups from an input that is ahead


class Worker(TrainerRole):
    def __init__(self, plan: Plan, pool_name: str, replica: int, version: int, resume_dir: Path | None,
                 control: ControlClient) -> None:
        """`control` is the worker's one control socket: made before anything that can fail, so that even
        an error in a node's setup reaches the controller on it (a second socket with the same identity
        would be refused by the controller's ROUTER)."""
        self.plan = plan
        self.pool = plan.pool(pool_name)
        self.replica = replica
        self.version = version
        self.worker_id = f"{pool_name}[{replica}]"
        self.control = control
        self.key = run_key(plan)
        recipe = load_recipe(plan.recipe, plan.overrides)
        self.config: RunConfig = recipe.config
        self.nodes: list[Node] = [recipe.graph.nodes[name] for name in self.pool.nodes]
        self.impls: list[Any] = []
        if self.pool.rendezvous:  # one rank of a data-parallel trainer: its node's engine joins the group
            rank_environment(self.pool.rendezvous, replica, self.pool.replicas)
        for n in self.nodes:
            impl = n.spec.instantiate()
            if hasattr(impl, "setup"):
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
        # transport.weights=broadcast: the policy trainer's ranks gather the weights, rank 0 broadcasts them
        self.broadcasting = self.pool.role == "train" and bool(plan.weights_rendezvous) and pool_name == plan.policy
        self.weights_group: Any = None
        if self.broadcasting:
            self._join_weights_group()
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
        self.outboxes = {c.dst: Outbox(c, plan, self.key) for c in plan.outputs_of(pool_name)}
        self.poller.register(self.control.socket, zmq.POLLIN)
        self.stopping = False
        self.counts: dict[str, int] = {"batches": 0, "samples": 0, "tokens": 0}
        self._last_beat = time.monotonic()
        self._busy_at_beat = 0.0
        self._latest_weights: dict[str, cmd.HoldWeights] = {}  # model -> the newest weights it was told to hold
        self.holding: set[int] = set()  # trainer: groups gathered for coming steps (not re-issued after a crash)
        self.census: int | None = None  # trainer: the controller asked what it holds (after a crash upstream)
        # trainer: the oldest group not consumed, and those above it a step took (out of admission order)
        self.next_group, self.consumed = _resumed_consumption(resume_dir, pool_name)
        self.staleness_policy = policy_named(self.config.staleness_policy, self.config.recycle_keep_prefix)
        self.enforcing = self.pool.role == "train" and pool_name == plan.policy  # its versions count the lags

    def _join_weights_group(self) -> None:
        """Trainer: form the weights group with the generators and send them the weights it starts from."""
        from areal.engines.weight_group import WeightGroup, group_device

        weights = guard(self.nodes[-1], self.impls[-1].policy_weights)
        if not self.follower:
            members = self.plan.weights_members()
            self.weights_group = WeightGroup(self.plan.weights_rendezvous, 0, len(members),
                                             device=group_device(self.config.generation.engine))
            self.weights_group.send(weights)

    # -- the shell around the loops -----------------------------------------------------

    def run(self) -> None:
        endpoints = {src: inbox.endpoint for src, inbox in self.inboxes.items()}
        self.control.send(msg.Ready(pid=os.getpid(), endpoints=endpoints))
        pulse = Pulse(self.plan.control_endpoint, self.worker_id, self.config.faults.heartbeat_s, self.key)
        loop = {"map": self._map_loop, "stream": self._stream_loop, "train": self._train_loop}[self.pool.role]
        try:
            (self._follow_loop if self.follower else loop)()
        finally:
            pulse.stop()
            self.spans.close()
        self.control.send(msg.Stopped(**self.counts))

    def _wait(self, timeout_ms: int) -> None:
        self.poller.poll(timeout_ms)
        self._commands()
        now = time.monotonic()
        if now - self._last_beat >= self.config.faults.heartbeat_s:
            busy = (self.chain.busy_s - self._busy_at_beat) / max(now - self._last_beat, 1e-9)
            self.control.send(msg.Heartbeat(busy=busy, holding=sorted(self.holding), **self.counts))
            self._last_beat, self._busy_at_beat = now, self.chain.busy_s

    def _commands(self) -> None:
        """Carry out the controller's commands, each parsed where it enters (a malformed one stops the worker)."""
        while (raw := self.control.recv(0)) is not None:
            command = cmd.parse(raw)
            COMMANDS[type(command)](self, command)

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

    def _on_frontier(self, command: cmd.ForgetBelow) -> None:
        if self.join is not None:
            self.join.forget_below(command.group)

    def _on_weights(self, command: cmd.HoldWeights) -> None:
        if command.broadcast:
            # a collective: the trainer waits in it until every generator has taken its part
            with self.spans.timed("weights", "receive weights", model=command.model, version=command.version):
                guard(self.nodes[0], self.impls[0].receive_weights, command.version)
            command = command.model_copy(update={"path": None})  # loaded already: the loop only notes the version
        self._latest_weights[command.model] = command  # with files, only the newest matters

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

    def _apply_weights(self, model: str) -> cmd.HoldWeights | None:
        """The newest weights `model`'s followers are to hold, if they were told since last asked."""
        return self._latest_weights.pop(model, None)

    def _follow_weights(self) -> None:
        """Map nodes that follow a trained model take its newest weights between groups."""
        for model, impls in self.followers.items():
            weights = self._apply_weights(model)
            if weights is not None and weights.path:
                with self.spans.timed("weights", "load weights", model=model, version=weights.version):
                    for impl in impls:
                        impl.load_weights(weights.path, weights.version)

    # -- the three loops ------------------------------------------------------------------

    def _map_loop(self) -> None:
        routed = [m for m in self.followers if self.pool.name in self.plan.followers(m)]
        while any(m not in self._latest_weights for m in routed) and not self.stopping:
            self._wait(100)  # the controller answers "ready" with each followed model's version: run nothing before
        while not self.stopping:
            self._wait(int(self.config.faults.heartbeat_s * 1000))
            self._follow_weights()
            for batch, meta in self._drain():
                done, metrics = self.chain.run(batch, held_out=meta.eval)
                self._report_metrics(metrics)
                self._send(done, meta)

    def _stream_loop(self) -> None:
        gen, head = self.impls[0], self.nodes[0]
        model = self.pool.model
        while model not in self._latest_weights and not self.stopping:
            self._wait(100)  # the controller answers "ready" with the newest version: sample nothing before it
        policy_version = self.version
        held: list[tuple[Batch, GroupMeta]] = []  # admitted at a version whose weights have not arrived
        submitted: dict[int, Batch] = {}  # group key -> the input it came with (its fields go on with its samples)
        while not self.stopping:
            busy = gen.pending() > 0
            self._wait(0 if busy else (100 if held else int(self.config.faults.heartbeat_s * 1000)))
            weights = self._apply_weights(model)
            if weights is not None:
                policy_version = weights.version
                with self.spans.timed("weights", "load weights", model=model, version=policy_version):
                    guard(head, gen.load_weights, weights.path, policy_version)
                if self.staleness_policy.drops:
                    self._abort_late(head, submitted, policy_version - self.config.staleness)
                if self.staleness_policy.recycles:
                    self._recycle_late(head, policy_version - self.config.staleness)
            # weights travel on the control socket, prompts on the data socket: either may arrive first
            held += self._drain()
            ready = [item for item in held if item[1].admitted_at <= policy_version]
            held = [item for item in held if item[1].admitted_at > policy_version]
            for batch, meta in ready:
                if meta.group in submitted:
                    continue  # re-issued after a crash downstream while still in flight here: that copy answers
                submitted[meta.group] = batch
                guard(head, gen.submit, self.chain.view(batch, self.plan.binding(head.name)), meta)
            if (running := gen.pending()) > 0:
                start = time.monotonic()
                finished = guard(head, gen.step)
                end = time.monotonic()
                self.chain.busy_s += end - start
                self.spans.add("decode", head.name, start, end, sequences=running)
                for out, meta in finished:
                    self._generated(head, submitted.pop(meta.group), out, meta)

    def _abort_late(self, head: Node, submitted: dict[int, Batch], oldest: int) -> None:
        """drop: stop every group holding a token sampled before version `oldest` (it can no longer be trained
        within η), report its samples dropped with the tokens they had, and send it on empty."""
        for meta, sample_ids, tokens in guard(head, self.impls[0].abort_older_than, oldest):
            self.control.send(msg.SamplesDropped(node=head.name, sample_ids=sample_ids, tokens=tokens,
                                                 reason=f"aborted in generation: a token older than version {oldest}"))
            ids = torch.empty(0, dtype=torch.int64)
            empty = Batch({**expand(submitted.pop(meta.group), ids), "sample_id": ids, "group_id": ids.clone()})
            self._send(self.chain.run(empty, held_out=False)[0], meta)

    def _recycle_late(self, head: Node, oldest: int) -> None:
        """recycle: re-queue every group stamped before version `oldest` with its output, and report them."""
        recycled = guard(head, self.impls[0].recycle_stamped_before, oldest)
        if recycled:
            stamp = recycled[0][0].stamped_at
            assert stamp is not None  # the generator stamps what it re-queues
            self.control.send(msg.GroupsRecycled(node=head.name, version=stamp,
                                                 groups=[meta.group for meta, _ in recycled],
                                                 tokens=[tokens for _, tokens in recycled]))

    def _generated(self, head: Node, submitted: Batch, out: Batch, meta: GroupMeta) -> None:
        """A finished group: the generator's outputs beside its input's fields, one row per sample; then the rest
        of the pool's nodes."""
        if "output_ids" in out:
            self.counts["tokens"] += int(out["output_ids"].values.numel())
        batch = Batch({**expand(submitted, out["group_id"]), "sample_id": out["sample_id"],
                       "group_id": out["group_id"]})
        fields: dict[str, Any] = dict(out)
        failed = fields.pop(FAILED, None)  # a stream node's per-row reasons (None: the sample is fine)
        if failed is not None:
            fields[FAILED] = {row: why for row, why in enumerate(failed) if why}
        if self.chain.log is not None and not meta.eval:
            texts = {port: batch[field] for port, field in self.plan.binding(head.name).items()
                     if head.inputs[port].dtype == "json"}
            self.chain.log.inputs(head.name, batch, texts)
        batch, _ = self.chain.absorb(head, batch, out, fields, meta.eval)
        batch, metrics = self.chain.run(batch, held_out=meta.eval, start=1)
        self._report_metrics(metrics)
        self._send(batch, meta)

    def _follow_loop(self) -> None:
        """A trainer rank > 0: rank 0's orders, in its order, so every collective meets its peers."""
        orders = self.orders
        assert orders is not None  # a follower is a rank of a multi-rank trainer
        while True:
            order, batch, fields = orders.receive()
            if order == "stop":
                return
            if order == "checkpoint":
                self._checkpoint(Path(fields["folder"]))
            else:
                self._train(batch, consumed=list(fields.get("consumed", [])))

    # -- the trainer's step -------------------------------------------------------------------

COMMANDS: dict[type[cmd.Command], Callable[[Worker, Any], None]] = {
    cmd.Stop: Worker._on_stop,
    cmd.Rewire: Worker._on_rewire,
    cmd.TakeCensus: Worker._on_census,
    cmd.ForgetBelow: Worker._on_frontier,
    cmd.HoldWeights: Worker._on_weights,
}


def _resumed_consumption(resume_dir: Path | None, pool: str) -> tuple[int, set[int]]:
    """A resumed trainer's oldest unconsumed group and the groups above it it consumed, as its checkpoint recorded;
    (0, none) for a fresh run."""
    if resume_dir is None:
        return 0, set()
    state = json.loads((resume_dir / MANIFEST).read_text())
    return int(state.get("next_group", {}).get(pool, 0)), {int(g) for g in state.get("consumed", {}).get(pool, [])}


def run_key(plan: Plan) -> RunKey | None:
    """The run's key when its sockets are TCP (the controller wrote it before starting any worker)."""
    return RunKey.read(plan.run_dir) if plan.secured else None


def main(argv: list[str]) -> int:
    plan_path, pool_name, replica = argv[0], argv[1], int(argv[2])
    version = int(argv[3]) if len(argv) > 3 else 0
    resume_dir = Path(argv[4]) if len(argv) > 4 else None
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {pool_name}[{replica}] %(levelname)s %(message)s")
    guard_process_group()  # before anything the worker starts: its children die with it
    plan = Plan.from_json(Path(plan_path).read_text())
    torch.set_num_threads(plan.pool(pool_name).threads)
    control = ControlClient(plan.control_endpoint, f"{pool_name}[{replica}]", run_key(plan))
    worker: Worker | None = None
    try:
        worker = Worker(plan, pool_name, replica, version, resume_dir, control)
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
        control.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

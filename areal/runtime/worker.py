"""One worker process: receive a batch, run its pool's nodes in order, send it downstream.

    python -m areal.runtime.worker PLAN_JSON POOL REPLICA [VERSION [RESUME_DIR]]

A worker rebuilds its nodes by loading the recipe named in the plan (no code crosses a socket),
then runs one loop chosen by its pool's role:
- map: one batch in, the nodes run, one batch out;
- stream: a generate node is stepped one decode step at a time, taking prompts and new weights
  between steps, and each finished group goes through the rest of the pool's nodes;
- train: groups are gathered until batch k (groups [kB, (k+1)B)) is complete, then the
  proximal pass and the update run and version k+1 is published. A trainer of several ranks
  (trainer.ranks) does this in rank 0, which orders the others to do the same (runtime/ranks.py).
A node that raises stops the worker with an "error" event naming it; the controller stops the run.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import zmq

from areal.config import RunConfig
from areal.errors import RunError, WireError
from areal.graph.batch import Batch
from areal.graph.meta import GroupMeta
from areal.graph.node import FAILED, Node
from areal.graph.recipe import load_recipe
from areal.runtime.channels import BatchReceiver, BatchSender, bind_address, is_dynamic
from areal.runtime.checkpoint import staging_dir
from areal.runtime.codec import FrameTooLarge
from areal.runtime.context import WorkerContext
from areal.runtime.control import ControlClient, Pulse
from areal.runtime.outputs import NodeContractError, checked_outputs
from areal.runtime.plan import Plan
from areal.runtime.ranks import RankOrders, rank_environment
from areal.runtime.security import RunKey
from areal.runtime.staleness import staleness_histogram

log = logging.getLogger("areal.worker")

SEND_RETRY_MS = 500


class NodeFailure(Exception):
    """A node's own code raised: the message names the node, the cause keeps the traceback."""

    def __init__(self, node: str, err: BaseException) -> None:
        self.node = node
        super().__init__(f"node '{node}' raised {type(err).__name__}: {err}")


class Worker:
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
                _guard(n.name, impl.setup, context)
            self.impls.append(impl)
        self.orders = RankOrders() if self.pool.rendezvous else None
        self.follower = self.orders is not None and replica > 0  # gets its steps from rank 0, not a socket
        # transport.weights=broadcast: every trainer rank gathers the weights, rank 0 broadcasts them
        self.broadcasting = self.pool.role == "train" and bool(plan.weights_rendezvous)
        self.weights_group: Any = None
        if self.broadcasting:
            self._join_weights_group()
        upstream = plan.pools[[p.name for p in plan.pools].index(pool_name) - 1].name
        self.poller = zmq.Poller()
        self.inbox: BatchReceiver | None = None
        if not self.follower:
            endpoint = bind_address(self.pool.endpoints[replica])
            self.inbox = BatchReceiver(endpoint, bind=True, hwm=plan.high_water_mark, name=f"'{upstream}'",
                                       max_frame_bytes=plan.max_frame_bytes, max_header_bytes=plan.max_header_bytes,
                                       allow_remote=self.config.transport.host != "127.0.0.1",  # asked for
                                       key=self.key)
            self.poller.register(self.inbox.socket, zmq.POLLIN)
        downstream = plan.next_pool(pool_name)
        self.outbox: BatchSender | None = None
        if downstream is not None and is_dynamic(downstream.endpoints):
            # the controller says where the next pool listens
            self.outbox = BatchSender(None, bind=False, key=self.key, **plan.sender_limits())
        elif downstream is not None:
            self.outbox = BatchSender(downstream.endpoints[0], bind=False, key=self.key, **plan.sender_limits())
            for endpoint in downstream.endpoints[1:]:
                self.outbox.socket.connect(endpoint)
        self.poller.register(self.control.socket, zmq.POLLIN)
        self.stopping = False
        self.busy_s = 0.0
        self.counts: dict[str, int] = {"batches": 0, "samples": 0, "tokens": 0}
        self._last_beat = time.monotonic()
        self._latest_weights: dict[str, Any] | None = None
        self.holding: set[int] = set()  # trainer: groups gathered for coming steps (not re-issued after a crash)

    def _join_weights_group(self) -> None:
        """Trainer: form the weights group with the generators and send them the weights it starts from."""
        from areal.engines.weight_group import WeightGroup, group_device

        weights = _guard(self.nodes[-1].name, self.impls[-1].policy_weights)
        if not self.follower:
            members = self.plan.weights_members()
            self.weights_group = WeightGroup(self.plan.weights_rendezvous, 0, len(members),
                                             device=group_device(self.config.generation.engine))
            self.weights_group.send(weights)

    # -- loop pieces ------------------------------------------------------------------

    def run(self) -> None:
        self.control.send("ready", pid=os.getpid(), endpoint=self.inbox.endpoint if self.inbox else None)
        pulse = Pulse(self.plan.control_endpoint, self.worker_id, self.config.faults.heartbeat_s, self.key)
        loop = {"map": self._map_loop, "stream": self._stream_loop, "train": self._train_loop}[self.pool.role]
        if self.follower:
            loop = self._follow_loop
        try:
            loop()
        finally:
            pulse.stop()
        self.control.send("stopped", **self.counts)

    def _wait(self, timeout_ms: int) -> None:
        self.poller.poll(timeout_ms)
        self._commands()
        now = time.monotonic()
        if now - self._last_beat >= self.config.faults.heartbeat_s:
            self.control.send("heartbeat", busy=self.busy_s / max(now - self._last_beat, 1e-9),
                              holding=sorted(self.holding), **self.counts)
            self._last_beat, self.busy_s = now, 0.0

    def _commands(self) -> None:
        while (message := self.control.recv(0)) is not None:
            if message["type"] == "stop":
                self.stopping = True
                self._on_stop(message)
            elif message["type"] == "peers" and self.outbox is not None:  # Ray: where the next pool listens
                for endpoint in message.get("disconnect", []):
                    self.outbox.disconnect(endpoint)
                for endpoint in message.get("connect", []):
                    self.outbox.connect(endpoint)
            elif message["type"] == "weights":
                if message.get("broadcast"):
                    # a collective: the trainer waits in it until every generator has taken its part
                    _guard(self.nodes[0].name, self.impls[0].receive_weights, int(message["version"]))
                    message = {**message, "path": None}  # loaded already: the loop only notes the version
                self._latest_weights = message  # with files, only the newest matters

    def _on_stop(self, message: Mapping[str, Any]) -> None:
        """Trainer: write the final checkpoint when the controller asks for it."""
        if self.pool.role == "train" and message.get("checkpoint"):
            self._checkpoint(Path(message["checkpoint"]))

    def _drain(self) -> list[tuple[Batch, GroupMeta]]:
        """The batches that arrived; one whose meta is malformed is refused and reported, never run."""
        got = []
        while self.inbox is not None and (item := self.inbox.recv(timeout_ms=0)) is not None:
            batch, raw = item
            try:
                got.append((batch, GroupMeta.from_wire(raw, self.inbox.name)))
            except WireError as err:
                self.inbox.rejected += 1
                groups = batch["group_id"].tolist() if isinstance(batch.get("group_id"), torch.Tensor) else []
                self.control.send("rejected", groups=[int(g) for g in groups], reason=str(err))
        return got

    def _send(self, batch: Batch, meta: GroupMeta) -> None:
        """Send downstream; a batch that could never cross the wire fails its samples, with the reason."""
        if self.outbox is None:
            return
        while True:
            try:
                self.outbox.send(batch, meta.to_wire(), timeout_ms=SEND_RETRY_MS)
                return
            except FrameTooLarge as err:
                # its samples fail with the reason; the group still travels (empty), so the batch it closes
                # closes: the trainer waits for every group of a step
                batch = self._fail_rows(self.nodes[-1], batch, dict.fromkeys(range(batch.size), str(err)), meta.eval)
            except TimeoutError:
                self._wait(0)  # back-pressure: keep answering the controller while downstream is full
                if self.stopping:
                    return

    def _run_chain(self, nodes: list[Node], impls: list[Any], batch: Batch, held_out: bool) -> Batch:
        for n, impl in zip(nodes, impls):
            start = time.monotonic()
            out = dict(_guard(n.name, impl, batch))
            self.busy_s += time.monotonic() - start
            failed = out.pop(FAILED, None) or {}
            out, non_finite = checked_outputs(n, batch, out)
            failed = {**non_finite, **failed}  # the node's own reason for a row wins
            batch = batch.merge(out)
            batch = self._fail_rows(n, batch, failed, held_out)
        self.counts["batches"] += 1
        self.counts["samples"] += batch.size
        return batch

    def _fail_rows(self, n: Node, batch: Batch, failed: Mapping[int, Any], held_out: bool) -> Batch:
        """Report the failed rows with their sample ids and reasons; the batch goes on without them."""
        if not failed:
            return batch
        rows = sorted(failed)
        self.control.send("failed", node=n.name, sample_ids=batch["sample_id"][rows].tolist(),
                          reasons=[str(failed[r]) for r in rows], eval=held_out)
        return batch.select([i for i in range(batch.size) if i not in failed])

    # -- the three loops --------------------------------------------------------------

    def _map_loop(self) -> None:
        while not self.stopping:
            self._wait(int(self.config.faults.heartbeat_s * 1000))
            for batch, meta in self._drain():
                self._send(self._run_chain(self.nodes, self.impls, batch, meta.eval), meta)

    def _stream_loop(self) -> None:
        gen, head = self.impls[0], self.nodes[0]
        while self._latest_weights is None and not self.stopping:
            self._wait(100)  # the controller answers "ready" with the newest version: sample nothing before it
        policy_version = self.version
        held: list[tuple[Batch, GroupMeta]] = []  # admitted at a version whose weights have not arrived
        while not self.stopping:
            busy = gen.pending() > 0
            self._wait(0 if busy else (100 if held else int(self.config.faults.heartbeat_s * 1000)))
            if self._latest_weights is not None:
                weights, self._latest_weights = self._latest_weights, None
                policy_version = int(weights["version"])
                _guard(head.name, gen.load_weights, weights.get("path"), policy_version)
            # weights travel on the control socket, prompts on the data socket: either may arrive first
            held += self._drain()
            ready = [item for item in held if item[1].admitted_at <= policy_version]
            held = [item for item in held if item[1].admitted_at > policy_version]
            for batch, meta in ready:
                _guard(head.name, gen.submit, batch, meta)
            if gen.pending() > 0:
                start = time.monotonic()
                finished = _guard(head.name, gen.step)
                self.busy_s += time.monotonic() - start
                for batch, meta in finished:
                    _, non_finite = checked_outputs(head, batch, {k: batch[k] for k in head.outputs if k in batch})
                    batch = self._fail_rows(head, batch, non_finite, meta.eval)
                    if "output_ids" in batch:
                        self.counts["tokens"] += int(batch["output_ids"].values.numel())
                    self._send(self._run_chain(self.nodes[1:], self.impls[1:], batch, meta.eval), meta)

    def _train_loop(self) -> None:
        per_step = self.pool.gather_groups
        waiting: dict[int, Batch] = {}
        while not self.stopping:
            self._wait(int(self.config.faults.heartbeat_s * 1000))
            for batch, meta in self._drain():
                if meta.eval:
                    self._report_eval(batch, meta)
                    continue
                group = meta.group
                if group in waiting or group < self.version * per_step:
                    self.control.send("duplicate", group=group)  # a re-issued group that already arrived
                    continue
                waiting[group] = batch
                self.holding.add(group)
            while self.version < self.config.steps and all(
                g in waiting for g in range(self.version * per_step, (self.version + 1) * per_step)
            ):
                wanted = range(self.version * per_step, (self.version + 1) * per_step)
                parts = [waiting.pop(g) for g in wanted]  # oldest first: group ids are admission order
                self.holding.difference_update(wanted)
                self._train(Batch.concat([p for p in parts if p.size]) if any(p.size for p in parts) else None)
                if self.stopping:
                    break
        if self.orders is not None:
            self.orders.send("stop")

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
                self._train(batch)

    def _train(self, batch: Batch | None) -> None:
        eta = self.config.effective_staleness
        step = self.version
        stats: dict[str, Any] = {}
        hist: dict[int, int] = {}
        if batch is not None:
            lags = staleness_histogram(step, [int(r.min()) if len(r) else step for r in batch["versions"].rows()])
            hist = dict(lags)
            if any(lag > eta for lag in lags):
                raise RunError(f"staleness bound broken at version {step}: lags {hist} exceed η={eta}")
        if self.orders is not None and not self.follower:
            self.orders.send("train", batch)
        if batch is not None:
            start = time.monotonic()
            batch = self._run_chain(self.nodes[:-1], self.impls[:-1], batch, held_out=False)
            middle = time.monotonic()
        if batch is not None and batch.size:
            stats = dict(_guard(self.nodes[-1].name, self.impls[-1], batch))
            end = time.monotonic()
            self.busy_s += end - middle
            stats |= {"prox_s": middle - start, "update_s": end - middle}
        else:  # every sample of the step failed: the version advances, the weights stay as they are
            _guard(self.nodes[-1].name, self.impls[-1].empty_step)
        self.version = step + 1
        path = self._publish()
        weights = _guard(self.nodes[-1].name, self.impls[-1].policy_weights) if self.broadcasting else None
        if self.follower:
            return  # rank 0 reports the step and decides on checkpoints
        self.control.send(
            "version", version=self.version, path=path, broadcast=self.broadcasting, stats=stats,
            staleness={str(k): v for k, v in hist.items()},
            sample_ids=batch["sample_id"].tolist() if batch is not None else [],
            rewards=batch["reward"].tolist() if batch is not None and "reward" in batch else [],
            tokens=int(batch["output_ids"].values.numel()) if batch is not None else 0,
        )
        if weights is not None:
            self.weights_group.send(weights)  # the controller tells the generators to take their part
        every = self.config.checkpoint.interval_steps
        if every and self.version % every == 0:
            self._checkpoint(staging_dir(self.plan.run_dir, self.version))

    def _publish(self) -> str | None:
        trainer = self.impls[-1]
        if not hasattr(trainer, "save_weights") or self.broadcasting:
            return None
        if self.follower:
            _guard(self.nodes[-1].name, trainer.save_weights, None)  # its part of gathering the weights
            return None
        folder = Path(self.plan.weights_dir)
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / f"v{self.version:06d}.safetensors"
        tmp = folder / f".v{self.version:06d}.tmp"
        _guard(self.nodes[-1].name, trainer.save_weights, str(tmp))
        os.replace(tmp, final)  # readers never see a half-written file
        keep = 3 + self.config.sampling_lag  # lagged mode: generators sample from the one η versions old
        for old in folder.glob("v*.safetensors"):
            # keep the newest; a file above this version is rolled-back work from before a resume
            if not self.version - keep < int(old.stem[1:]) <= self.version:
                old.unlink(missing_ok=True)
        return str(final)

    def _checkpoint(self, folder: Path) -> None:
        trainer = self.impls[-1]
        if self.orders is not None and not self.follower:
            self.orders.send("checkpoint", folder=str(folder))
        if hasattr(trainer, "save_checkpoint"):
            target = folder / "trainer"
            target.mkdir(parents=True, exist_ok=True)
            _guard(self.nodes[-1].name, trainer.save_checkpoint, str(target))  # FSDP: a collective, rank 0 writes
        if self.broadcasting:  # no weights file to copy: the checkpoint's policy (export, resume) is written here
            policy = None if self.follower else str(folder / "policy.safetensors")
            _guard(self.nodes[-1].name, trainer.save_weights, policy)
        if not self.follower:
            self.control.send("checkpoint", version=self.version, path=str(folder))

    def _report_eval(self, batch: Batch, meta: GroupMeta) -> None:
        rewards = batch["reward"].tolist() if "reward" in batch else []
        self.control.send("eval", round=meta.round, task_ids=list(meta.task_ids),
                          rewards=rewards, sample_ids=batch["sample_id"].tolist())


def _guard(node: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except (NodeFailure, RunError):
        raise
    except Exception as err:
        raise NodeFailure(node, err) from err


def run_key(plan: Plan) -> RunKey | None:
    """The run's key when its sockets are TCP (the controller wrote it before starting any worker)."""
    return RunKey.read(plan.run_dir) if plan.secured else None


def main(argv: list[str]) -> int:
    plan_path, pool_name, replica = argv[0], argv[1], int(argv[2])
    version = int(argv[3]) if len(argv) > 3 else 0
    resume_dir = Path(argv[4]) if len(argv) > 4 else None
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {pool_name}[{replica}] %(levelname)s %(message)s")
    plan = Plan.from_json(Path(plan_path).read_text())
    torch.set_num_threads(plan.pool(pool_name).threads)
    control = ControlClient(plan.control_endpoint, f"{pool_name}[{replica}]", run_key(plan))
    try:
        Worker(plan, pool_name, replica, version, resume_dir, control).run()
        return 0
    except BaseException as err:  # report everything, even KeyboardInterrupt, before exiting non-zero
        node = err.node if isinstance(err, NodeFailure) else None
        text = str(err) if isinstance(err, (NodeFailure, RunError)) else f"{type(err).__name__}: {err}"
        log.error("%s", traceback.format_exc())
        # a broken contract fails the same way on every retry: the controller stops the run instead of restarting
        control.send("error", node=node, message=text, traceback=traceback.format_exc(),
                     fatal=isinstance(err, NodeContractError))
        return 1
    finally:
        control.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The stream role of a worker: a generate (or episode) node is stepped one decode step at a time, taking
prompts and new weights between steps, and each finished group goes through the rest of the pool's nodes.
An episode node runs here too: its runner (nodes/episodes/worker.py) is the stream node, stepping the
policy's engine and the episodes' event loop. A mixin of `Worker` (main.py), which holds the state these
methods read."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch

from areal.graph.batch import Batch
from areal.graph.meta import GroupMeta
from areal.graph.node import Node
from areal.graph.roles import FAILED, Aborting, Recycling, StreamNode
from areal.runtime import weights
from areal.runtime.wire import messages as msg
from areal.runtime.worker.chain import guard
from areal.runtime.worker.join import expand


class StreamRole:
    """What a worker of a stream pool does beyond the common loop."""

    def _stream_loop(self) -> None:
        gen: StreamNode = self.impls[0]
        head = self.nodes[0]
        model = self.pool.model
        while model not in self._latest_weights and not self.stopping:
            self._wait(100)  # the controller answers "ready" with the newest version: sample nothing before it
        held: list[tuple[Batch, GroupMeta]] = []  # admitted at a version whose weights have not arrived
        submitted: dict[int, Batch] = {}  # group key -> the input it came with (its fields go on with its samples)
        while not self.stopping:
            busy = gen.pending() > 0
            self._wait(0 if busy else (100 if held else int(self.config.faults.heartbeat_s * 1000)))
            update = self._apply_weights(model)
            if update is not None:
                with self.spans.timed("weights", "load weights", model=model, version=update.version):
                    loaded = guard(head, weights.receive, update, gen)
                if not loaded:
                    continue  # superseded before it was read: the newer version's update follows
                if update.via is None:  # the weights it holds already (v0, or taken in a collective): named now
                    gen.version = update.version
                if self.staleness_policy.drops:
                    self._abort_late(head, submitted, gen.version - self.config.staleness)
                if self.staleness_policy.recycles:
                    self._recycle_late(head, gen.version - self.config.staleness)
            # weights travel on the control socket, prompts on the data socket: either may arrive first
            held += self._drain()
            ready = [item for item in held if item[1].admitted_at <= gen.version]
            held = [item for item in held if item[1].admitted_at > gen.version]
            for batch, meta in ready:
                if meta.group in submitted:
                    continue  # re-issued after a crash downstream while still in flight here: that copy answers
                submitted[meta.group] = batch
                meta = replace(meta, sampled_by=self.worker_id)  # whose weights sample it: the mismatch alarm's name
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
        gen: Aborting = self.impls[0]
        for meta, sample_ids, tokens in guard(head, gen.abort_older_than, oldest):
            self.control.send(msg.SamplesDropped(node=head.name, sample_ids=sample_ids, tokens=tokens,
                                                 reason=f"aborted in generation: a token older than version {oldest}"))
            ids = torch.empty(0, dtype=torch.int64)
            empty = Batch({**expand(submitted.pop(meta.group), ids), "sample_id": ids, "group_id": ids.clone()})
            self._send(self.chain.run(empty, held_out=False)[0], meta)

    def _recycle_late(self, head: Node, oldest: int) -> None:
        """recycle: re-queue every group stamped before version `oldest` with its output, and report them."""
        gen: Recycling = self.impls[0]
        recycled = guard(head, gen.recycle_stamped_before, oldest)
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

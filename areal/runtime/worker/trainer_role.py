"""The train role of a worker: taking groups in the order the staleness policy says, the step
(proximal pass, update, the policy's check), publishing the new version, checkpoints and reports.
A mixin of `Worker` (main.py), which holds the state these methods read: the pool's nodes, its
chain and its control client. The model's version is the trainer node's own counter, read, never kept."""

from __future__ import annotations

import json
import logging
import resource
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from areal.errors import NodeContractError
from areal.graph.batch import Batch, Ragged
from areal.graph.meta import GroupMeta
from areal.graph.roles import Checkpointed, TrainerNode
from areal.runtime.compiler.plan import IMPLICIT
from areal.runtime.records.solved import solved
from areal.runtime.records.spans import StepWait
from areal.runtime.staleness.policies.enforce import checked_step, expired, with_policy_mask
from areal.runtime.staleness.policies.loss_mask import loss_mask, with_truncated_masked
from areal.runtime.storage.checkpoint import MANIFEST, staging_dir
from areal.runtime.wire import messages as msg
from areal.runtime.worker import mismatch
from areal.runtime.worker.chain import guard, in_place_versions, returned, unchanged

log = logging.getLogger("areal.worker")


class TrainerRole:
    """What a worker of a train pool does beyond the common loop (see the module's docstring)."""

    def _train_loop(self) -> None:
        per_step = self.pool.gather_groups
        waiting: dict[int, tuple[Batch, GroupMeta]] = {}
        dropped: list[int] = []  # groups dropped unread since the last step: consumed with the next
        idle = StepWait(self.spans)
        ended_said = False
        while not self.stopping:
            self._wait(int(self.config.faults.heartbeat_s * 1000))
            for batch, meta in self._drain():
                if meta.eval:
                    self._report_eval(batch, meta)
                    continue
                if meta.group in waiting or meta.group < self.next_group or meta.group in self.consumed:
                    self.control.send(msg.DuplicateDropped(group=meta.group))  # a re-issued group that already arrived
                    continue
                waiting[meta.group] = (batch, meta)
                self.holding.add(meta.group)
                idle.arrived(meta)
            if self.census is not None:
                self.control.send(msg.Census(seq=self.census, holding=sorted(self.holding)))
                self.census = None
            while self.trained_version < self.config.steps and not self.training_ended:
                dropped += self._drop_expired(waiting)
                step = self.staleness_policy.pick({g: b.size for g, (b, _) in waiting.items()}, self.next_group,
                                                  self.consumed, per_step)
                if not step:
                    break
                parts = [waiting.pop(g) for g in step]  # in admission order: group ids are admission order
                self._consume(step + dropped)
                kept = [(b, m) for b, m in parts if b.size]
                idle.ended(step, self.trained_version + 1, dropped=dropped)
                self._train(Batch.concat([b for b, _ in kept]) if kept else None, consumed=sorted(step + dropped),
                            groups=[m for _, m in kept])
                idle.restart()
                dropped = []
                if self.stopping:
                    break
            if self.training_ended and not ended_said:  # after its last VersionPublished, on the same socket
                self.control.send(msg.TrainingEnded(model=self.pool.name, version=self.trained_version))
                ended_said = True
        if self.orders is not None:
            self.orders.send("stop")

    @property
    def trained_version(self) -> int:
        """This pool's model's version: its trainer node's own counter, the only one (the worker keeps none)."""
        return int(self.impls[-1].version)

    def _consume(self, groups: list[int]) -> None:
        """Groups a step took (or dropped): never taken again; `next_group` moves past every consumed one."""
        self.holding.difference_update(groups)
        self.consumed.update(groups)
        while self.next_group in self.consumed:
            self.consumed.discard(self.next_group)
            self.next_group += 1

    def _drop_expired(self, waiting: dict[int, tuple[Batch, GroupMeta]]) -> list[int]:
        """drop: the arrived groups the next step could not train within η, reported dropped (with the tokens
        they had generated) and taken out of `waiting`; they are consumed with the next step."""
        versions = self.plan.versions_field
        if not (self.staleness_policy.drops and self.enforcing and versions):
            return []
        late = sorted(g for g, (b, _) in waiting.items()
                      if b.size and expired(b[versions], self.trained_version, self.config.staleness))
        reason = f"older than η={self.config.staleness} at version {self.trained_version}"
        for group in late:
            batch, _ = waiting.pop(group)
            self.control.send(msg.SamplesDropped(node=self.nodes[-1].name, sample_ids=batch["sample_id"].tolist(),
                                                 tokens=batch[versions].lengths.tolist(), reason=reason))
        self.holding.difference_update(late)
        return late

    def _train(self, batch: Batch | None, consumed: list[int], groups: list[GroupMeta] | None = None) -> None:
        """One step on `batch` (None: every sample of it is gone); `groups`: the metas of its groups (rank 0)."""
        step = self.trained_version
        began = time.monotonic()
        stats: dict[str, Any] = {}
        hist: dict[int, int] = {}
        if self.orders is not None and not self.follower:
            self.orders.send("train", batch, consumed=consumed)
        trainer: TrainerNode = self.impls[-1]
        if batch is not None:
            start = time.monotonic()
            batch, metrics = self.chain.run(batch, held_out=False, stop=len(self.nodes) - 1)
            middle = time.monotonic()
            stats |= metrics
        if batch is not None and batch.size:
            binding = self.plan.binding(self.nodes[-1].name)
            # what the loss reads, and the versions η is checked by even where the node declares none
            versions = {"versions": self.plan.versions_field} if self.enforcing else {}
            audit = self.chain.view(batch, {**versions, **binding})
            if self.lag0_limit is not None and not self.follower:  # before any mask: every sampled token counts
                stats |= mismatch.checked(audit, step, {m.group: m.sampled_by or "a generator" for m in groups or []},
                                          self.config.generation.keeps_kv, self.lag0_limit)
            if self.masks_truncated:  # before the policy's mask: its count and its check see what the loss sees
                audit, stats["truncated_masked"] = with_truncated_masked(audit)
            if self.enforcing:
                if self.staleness_policy.masks:  # every rank: the same mask from the same versions
                    audit, stats["masked_tokens"] = with_policy_mask(audit, step, self.config.staleness)
                if not self.follower:
                    numbers = checked_step(self.staleness_policy, audit, step, self.config.effective_staleness,
                                           self.config.batch_size, groups or [])
                    hist, stats["stale_tokens"] = numbers["staleness"], numbers["stale_tokens"]
            reads = self.nodes[-1].inputs
            view = Batch({name: value for name, value in audit.items() if name in binding or name in IMPLICIT
                          or (name == "loss_mask" and name in reads)})
            given = in_place_versions(view)
            stats |= returned(self.nodes[-1], guard(self.nodes[-1], trainer, view))
            unchanged(self.nodes[-1], view, given, binding)
            end = time.monotonic()
            self.spans.add("node", self.nodes[-1].name, middle, end, samples=batch.size)
            if self.chain.log is not None:
                mask = Ragged(loss_mask(audit).to(torch.int32), audit["versions"].offsets) \
                    if "versions" in audit else None
                self.chain.log.trained(self.nodes[-1].name, step + 1, batch["sample_id"].tolist(),
                                       audit.get("versions"), mask)
            self.chain.busy_s += end - middle
            stats |= {"prox_s": middle - start, "update_s": end - middle,
                      "trainer_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # Linux: KiB
        else:  # every sample of the step failed or was filtered: the version advances, the weights stay as they are
            guard(self.nodes[-1], trainer.empty_step)
        if self.trained_version != step + 1:
            raise NodeContractError(f"trainer node '{self.nodes[-1].name}': a step must advance its version by one "
                                    f"(from {step} it went to {self.trained_version})")
        with self.spans.timed("publish", "publish weights", version=self.trained_version):
            via = self.publisher.publish(self.trained_version)
        if (sent := self.publisher.sent_bytes()) is not None:
            stats["weights_sent_mib"] = sent / 2**20
        self.spans.add("step", "train step", began, time.monotonic(), version=self.trained_version,
                       samples=batch.size if batch is not None else 0)
        if self.follower:
            return  # rank 0 reports the step and decides on checkpoints
        reward = self.plan.reward_field
        self.control.send(msg.VersionPublished(
            model=self.pool.name, version=self.trained_version, via=via,
            stats=stats, staleness={str(k): v for k, v in hist.items()}, groups=consumed,
            next_group=self.next_group,
            sample_ids=batch["sample_id"].tolist() if batch is not None else [],
            rewards=batch[reward].tolist() if batch is not None and reward in batch else [],
            solved=self._solved(batch),
            tokens=_tokens(batch, self.plan.binding(self.nodes[-1].name)),
        ))
        self.publisher.reported()  # a broadcast sends now: the controller tells the generators to take their part
        every = self.config.checkpoint.interval_steps
        if every and self.trained_version % every == 0:
            self._checkpoint(staging_dir(self.plan.run_dir, self.trained_version, tag="interval"))

    def _checkpoint(self, folder: Path) -> None:
        """Write this trainer's part of a checkpoint into its staging folder; the controller seals it."""
        trainer: TrainerNode = self.impls[-1]
        if self.orders is not None and not self.follower:
            self.orders.send("checkpoint", folder=str(folder))
        folder.mkdir(parents=True, exist_ok=True)  # the publisher writes the policy here when no file has it
        if isinstance(trainer, Checkpointed):
            target = folder / f"trainer-{self.pool.name}"
            target.mkdir(exist_ok=True)
            guard(self.nodes[-1], trainer.save_checkpoint, str(target))  # FSDP: a collective, rank 0 writes
        self.publisher.checkpoint(folder)
        if not self.follower:
            if self.mirror is not None:  # no run directory on this node: the part goes to the controller first,
                self.send_files()  # after the records of every step it holds (a lost node loses only later ones)
                self.send_files(self.mirror.tree(folder))
            self.control.send(msg.CheckpointWritten(model=self.pool.name, version=self.trained_version,
                                                    path=self.mirror.homeward(folder) if self.mirror else str(folder),
                                                    next_group=self.next_group, consumed=sorted(self.consumed)))
            if self.mirror is not None:
                shutil.rmtree(folder, ignore_errors=True)

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

    def _report_eval(self, batch: Batch, meta: GroupMeta) -> None:
        if self.pool.name != self.plan.policy and self.plan.policy:
            return  # the sampled policy's trainer reports held-out rounds; the others only see them pass
        reward = self.plan.reward_field
        rewards = batch[reward].tolist() if reward in batch else []
        assert meta.round is not None  # GroupMeta.from_wire refuses a held-out meta without its round
        self.control.send(msg.HeldOutScored(round=meta.round, task_ids=list(meta.task_ids), rewards=rewards,
                                            solved=self._solved(batch), sample_ids=batch["sample_id"].tolist()))

    def _solved(self, batch: Batch | None) -> list[bool]:
        field = self.plan.solved_field
        return solved(batch[field].tolist(), self.plan.solved_at) if batch is not None and field in batch else []

    def _report_metrics(self, metrics: Mapping[str, float]) -> None:
        if metrics:
            self.control.send(msg.NodeMetrics(values=dict(metrics)))


def _tokens(batch: Batch | None, binding: Mapping[str, str]) -> int:
    field = binding.get("output_ids")
    return int(batch[field].values.numel()) if batch is not None and field in batch else 0


def resumed_consumption(resume_dir: Path | None, pool: str) -> tuple[int, set[int]]:
    """A resumed trainer's oldest unconsumed group and the groups above it it consumed, as its checkpoint recorded;
    (0, none) for a fresh run."""
    if resume_dir is None:
        return 0, set()
    state = json.loads((resume_dir / MANIFEST).read_text())
    return int(state.get("next_group", {}).get(pool, 0)), {int(g) for g in state.get("consumed", {}).get(pool, [])}

"""What a node sees of the runtime when its worker starts: the config and where to write."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal.config import RunConfig
from areal.runtime.compiler.plan import Plan, PoolSpec
from areal.runtime.storage import weight_files
from areal.runtime.storage.checkpoint import policy_name
from areal.runtime.wire import messages
from areal.runtime.wire.control import ControlClient


@dataclass
class WorkerContext:
    config: RunConfig
    plan: Plan
    pool: PoolSpec
    replica: int
    node: str  # the node being set up
    version: int  # the policy version the run is at (non-zero after a resume)
    resume_dir: Path | None  # the checkpoint folder to restore from: trainer-NODE/ and policy-MODEL.safetensors
    control: ControlClient

    @property
    def run_dir(self) -> Path:
        return Path(self.plan.run_dir)

    def published_weights(self, version: int) -> Path:
        """Where the trainer of the model this pool follows publishes version `version` (transport.weights=files)."""
        return weight_files.published(self.plan.weights_dir, self.pool.model, version)

    def resumed_policy(self) -> Path | None:
        """The followed model's weights in the checkpoint this run resumes from (None for a fresh run)."""
        return self.resume_dir / policy_name(self.pool.model) if self.resume_dir else None

    @property
    def lora_rank(self) -> int:
        """The rank of the LoRA adapters the policy publishes instead of its weights (0: full weights)."""
        return self.plan.lora_rank

    @property
    def worker_id(self) -> str:
        return f"{self.pool.name}[{self.replica}]"

    @property
    def weights_group(self) -> tuple[str, int, int] | None:
        """(rendezvous, member, size) of the weights group this worker is in (transport.weights=broadcast)."""
        members = self.plan.weights_members()
        if not self.plan.weights_rendezvous or self.worker_id not in members:
            return None
        return self.plan.weights_rendezvous, members[self.worker_id], len(members)

    def note(self, sample_ids: list[int], reasons: list[str]) -> None:
        """Samples that train on but are counted, each with its reason (an over-long or empty generation)."""
        self.control.send(messages.SamplesNoted(node=self.node, sample_ids=sample_ids, reasons=reasons))

    def report(self, kind: str, **fields: Any) -> None:
        """Send the controller a message of `kind` (messages.py) tagged with this node. Nodes cannot import the
        runtime's types, so the message is typed here, where it enters: a malformed one fails in the node."""
        self.control.send(messages.parse({"type": kind, "node": self.node, **fields}, self.worker_id))

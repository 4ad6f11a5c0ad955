"""What runs in the workers of the actor-critic nodes (critic.py): values, GAE, the critic's update."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from areal.engines.training.step_stats import combined
from areal.errors import ConfigError
from areal.graph.batch import Batch, Ragged
from areal.graph.roles import METRICS
from areal.nodes.workers.policy import full_sequences, load_run_policy
from areal.nodes.workers.trainer import TrainerNode, update_steps


def _critic_engine(config: Any) -> Any:
    """The run's model turned critic (models/value.py), in a value engine with the trainer's settings."""
    from areal.engines import train_settings
    from areal.engines.device import torch_device
    from areal.engines.training.value_train import ValueTrainEngine
    from areal.models.value import value_model

    policy, _ = load_run_policy(config)
    return ValueTrainEngine(value_model(policy), train_settings(config), device=torch_device(config.trainer.device))


class ValuesNode:
    """Scores each sample's states with the critic; takes the critic trainer's weights as they come."""

    def __init__(self, model: str) -> None:
        self.model_name = model

    def setup(self, context: Any) -> None:
        self.engine = _critic_engine(context.config)  # version 0: the same critic its trainer starts from

    def load_weights(self, weights: Mapping[str, Tensor], version: int) -> None:
        self.engine.load_state_dict(dict(weights))

    def __call__(self, batch: Batch) -> dict[str, Any]:
        sequences, prompt_lens = full_sequences(batch["prompt_ids"], batch["output_ids"])
        values = self.engine.sequence_values(sequences)
        return {"values": Ragged.from_rows([v[p - 1 :] for v, p in zip(values, prompt_lens)], dtype=torch.float32)}


class GAENode:
    def __init__(self, gamma: float, lam: float, whiten: bool) -> None:
        self.gamma, self.lam, self.whiten = gamma, lam, whiten

    def __call__(self, batch: Batch) -> dict[str, Any]:
        from areal.kernels.advantage import gae

        values: Ragged = batch["values"]
        rewards = torch.zeros_like(values.values, dtype=torch.float32)
        ends = values.offsets[1:][values.lengths > 0] - 1  # an outcome reward lands on the last token
        rewards[ends] = batch["reward"][values.lengths > 0].to(torch.float32)
        advantages, returns = gae(rewards, values.values, values.offsets, gamma=self.gamma, lam=self.lam)
        if self.whiten and advantages.numel() > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        return {"advantage": Ragged(advantages.float(), values.offsets),
                "returns": Ragged(returns.float(), values.offsets),
                METRICS: {"value_mean": float(values.values.mean()) if len(values.values) else 0.0}}


class ValueTrainerNode(TrainerNode):
    """The critic's trainer: versions, weights, checkpoints and resume as a policy trainer's; its loss the
    clipped value regression (kernels/value.py)."""

    def __init__(self, value_clip: float | None) -> None:
        self.value_clip = value_clip

    def _engine(self, config: Any) -> Any:
        if config.trainer.engine != "torch" or config.trainer.ranks != 1:
            raise ConfigError("value_update: a critic trains on one process of the torch engine "
                              f"(trainer.engine={config.trainer.engine!r}, ranks={config.trainer.ranks})")
        return _critic_engine(config)

    def __call__(self, batch: Batch) -> dict[str, float]:
        from areal.kernels.value import clipped_value_loss

        sequences, prompt_lens = full_sequences(batch["prompt_ids"], batch["output_ids"])

        def loss_fn(values: torch.Tensor, mb: Any) -> tuple[torch.Tensor, dict[str, float]]:
            loss, stats = clipped_value_loss(values, mb["values"], mb["returns"], clip_eps=self.value_clip)
            return loss, {k: v for k, v in vars(stats).items() if k != "value_loss"}

        rows = [i for i, out in enumerate(batch["output_ids"].rows()) if len(out)]
        if not rows:
            self.empty_step()
            return {}
        steps = []
        for index in update_steps(rows, self.minibatches, self.epochs):  # as the policy's, all at this version's lr
            extra = {"values": [batch["values"][i] for i in index], "returns": [batch["returns"][i] for i in index]}
            stats = self.engine.train_step([sequences[i] for i in index], [prompt_lens[i] for i in index], loss_fn,
                                           extra, lr_step=self.version)
            steps.append((stats, stats["tokens"]))
        self.version += 1
        return {name: float(value) for name, value in combined(steps).items()}

"""What runs inside a trainer worker: the proximal pass and the (decoupled) PPO update.

The ppo-update node owns the model; the compute-logprob node colocated before it reads that
same model (a per-process registry keyed by trainer name), so π_prox is computed with exactly
the weights the update starts from. Objectives (RunConfig.trainer.objective):
- decoupled: w = π_prox/π_behav (capped), u = π_θ/π_prox — AReaL's objective;
- standard: the ratio against π_behav (no proximal pass: π_prox := π_behav);
- decoupled-shortcut: π_prox interpolated from π_behav and π_θ by version (no proximal pass).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from areal.engines.training.step_stats import Peak, Total, combined
from areal.engines.training.torch_train import NonFiniteUpdate, TorchTrainEngine
from areal.engines.training.trainer_settings import TrainSettings
from areal.errors import ConfigError
from areal.graph.batch import Batch, Ragged
from areal.nodes.workers.policy import full_sequences, load_run_policy, save_weights

TRAINERS: dict[str, TrainerNode] = {}
BASE_FILE = "lora_base.json"  # a LoRA trainer's checkpoint part names its base here
# the loss's numbers that are not token-weighted means: counted tokens add up, the largest weight is the largest
STAT_KINDS = {"valid_tokens": Total, "capped_tokens": Total, "importance_weight_max": Peak}


def update_steps(rows: list[int], minibatches: int, epochs: int) -> list[list[int]]:
    """The batch rows of each optimizer step of one version: `epochs` passes over the same `minibatches` (every
    minibatches-th row, so each holds samples of every length)."""
    parts = [p for p in (rows[i :: minibatches] for i in range(minibatches)) if p]
    return [p for _ in range(epochs) for p in parts]


class TrainerNode:
    def setup(self, context: Any) -> None:
        from areal.engines import require_engines

        config = context.config  # this node's view: its own settings (ppo_update(..., lr=...)) on top
        require_engines(config, generation=False)  # before loading the model: the error comes in seconds
        t = config.trainer
        self.clip_eps, self.clip_eps_high, self.dual_clip = t.clip_eps, t.clip_eps_high, t.dual_clip
        self.sample_ratio = t.ratio == "sequence"  # GSPO's: one clipped ratio per sample
        self.kl_coef = t.kl_coef  # > 0: the compiler checked a frozen reference feeds `ref_logp`
        self.entropy_coef = t.entropy_coef
        self.loss_agg, self.max_tokens = t.loss_agg, config.generation.max_new_tokens
        self.objective = t.objective
        self.cap = t.behav_weight_cap
        self.minibatches, self.epochs = t.minibatches, t.epochs
        self.lora = t.lora if t.lora.rank else None  # trains adapters: they alone are published and checkpointed
        self.base_sha256 = ""  # LoRA: the hash of the base the adapters sit on
        self.engine = self._engine(config)
        # the proximal node's forward, kept for the update (TorchTrainEngine.sequence_logprobs)
        self.keeps_proximal_forward = isinstance(self.engine, TorchTrainEngine) and t.reuses_proximal_forward(
            on_cpu=self.engine.device.type == "cpu")
        self.version = context.version
        if context.resume_dir is not None:
            folder = context.resume_dir / f"trainer-{context.node}"
            self._check_base(folder)
            saved = self.engine.load(folder)
            if saved != self.version:
                raise ValueError(f"{folder} holds version {saved} of '{context.node}', but the run resumes at "
                                 f"version {self.version}: the checkpoint is inconsistent")
        TRAINERS[context.node] = self

    def _engine(self, config: Any) -> Any:
        """The model this node trains, in its engine (trainer.engine: torch, or FSDP, which shards it)."""
        from areal.engines import train_engine

        def policy() -> Any:
            model = load_run_policy(config)[0]
            if self.lora is None:
                return model
            from areal.engines.lora.training import base_sha256, with_adapters

            self.base_sha256 = base_sha256(model.state_dict())
            return with_adapters(model, self.lora)

        return train_engine(config, policy)  # emulated: loads none

    @property
    def weights_kind(self) -> str:
        """What `policy_weights` holds: the whole policy ("full"), or a LoRA policy's adapters alone ("lora")."""
        return "full" if self.lora is None else "lora"

    def __call__(self, batch: Batch) -> dict[str, float]:
        from areal.kernels.ppo import approx_prox_logp, decoupled_ppo_loss, sample_weights

        sequences, prompt_lens = full_sequences(batch["prompt_ids"], batch["output_ids"])
        publishes = self.version + 1  # v_θ of the shortcut: the version this update publishes
        advantage = batch["advantage"]
        token_level = isinstance(advantage, Ragged)  # ppo_update(token_advantages=True): one per token (GAE)
        # an episode's loss mask: its tool and environment tokens (0) are context, not actions, never trained
        masked = "loss_mask" in batch
        trained_tokens = [0]  # loss-mask tokens of the minibatch being trained (the mean's denominator)

        def loss_fn(logp: Tensor, mb: Any) -> tuple[Tensor, dict[str, float]]:
            behav = mb["behav_logp"]
            if self.objective == "standard":
                prox = behav
            elif self.objective == "decoupled-shortcut":
                prox = approx_prox_logp(behav, logp.detach(), mb["versions"].long(), publishes)
            else:
                prox = mb["prox_logp"]
            advantages = mb["advantage"] if token_level else mb.per_token(mb["advantage"])
            if "weight" in mb.fields:  # loss_agg: a sample's weight scales its terms (the objective is linear in A)
                advantages = advantages * mb.per_token(mb["weight"])
            mask = mb["loss_mask"].bool() if masked else torch.ones_like(logp, dtype=torch.bool)
            entropy = mb.fields.get("entropy")  # the torch and FSDP engines' (the config refuses a bonus without)
            loss, stats = decoupled_ppo_loss(logp, prox, behav, advantages, mask, clip_eps=self.clip_eps,
                                             clip_eps_high=self.clip_eps_high, dual_clip=self.dual_clip,
                                             behav_weight_cap=self.cap, kl_coef=self.kl_coef,
                                             ref_logp=mb["ref_logp"] if self.kl_coef else None,
                                             entropy=entropy, entropy_coef=self.entropy_coef,
                                             cu_seqlens=mb.cu_seqlens if self.sample_ratio else None)
            numbers = {k: STAT_KINDS.get(k, float)(v) for k, v in vars(stats).items()
                       if isinstance(v, (int, float)) and k != "loss"}
            if masked:  # as a sum the engine divides by all output tokens: make it the mean over trained ones
                loss = loss * stats.valid_tokens * mb.batch_tokens / max(trained_tokens[0], 1)
            return loss, numbers

        extra: dict[str, Any] = {
            "behav_logp": batch["behav_logp"].rows(),
            "prox_logp": batch["prox_logp"].rows(),
            "versions": [v.to(torch.int64) for v in batch["versions"].rows()],
            "advantage": ([a.to(torch.float32) for a in advantage.rows()] if token_level
                          else advantage.to(torch.float32)),
        }
        if masked:
            extra["loss_mask"] = batch["loss_mask"].rows()
        if self.kl_coef:
            extra["ref_logp"] = batch["ref_logp"].rows()
        steps: list[tuple[dict[str, float], float]] = []
        # a sample with no output tokens (an empty generation) has no term in the token mean: leave it out
        rows = [i for i, out in enumerate(batch["output_ids"].rows()) if len(out)]
        for index in update_steps(rows, self.minibatches, self.epochs):
            sub = {k: (v[index] if isinstance(v, Tensor) else [v[i] for i in index]) for k, v in extra.items()}
            # the lr schedule runs over policy versions: every minibatch of this one shares its lr
            if masked:
                trained_tokens[0] = int(sum(int(extra["loss_mask"][i].sum()) for i in index))
            if self.loss_agg != "token-mean":
                tokens = torch.tensor([int(extra["loss_mask"][i].sum()) if masked else len(extra["behav_logp"][i])
                                       for i in index])
                sub["weight"] = sample_weights(tokens, self.loss_agg, self.max_tokens).to(torch.float32)
            try:
                stats = self.engine.train_step([sequences[i] for i in index], [prompt_lens[i] for i in index],
                                               loss_fn, sub, lr_step=self.version,
                                               loss_reduction="sum" if masked else "mean")
            except NonFiniteUpdate as err:
                raise NonFiniteUpdate(f"training version {self.version + 1}: {err}") from None
            steps.append((stats, stats["tokens"]))
        totals = {name: float(value) for name, value in combined(steps).items()}  # the optimizer steps', by kind
        self.version += 1
        # all zero (one sample per group, say): the step moved nothing, and the controller says so once
        totals["zero_advantage"] = float(((advantage.values if token_level else advantage) == 0).float().mean())
        if "entropy" not in totals:  # an engine without distributions (emulated): each trained token was drawn
            # from π_behav, so the mean of −log π_behav estimates its entropy per token
            drawn = batch["behav_logp"].values
            drawn = drawn[batch["loss_mask"].values.bool()] if masked else drawn
            totals["entropy"] = float(-drawn.double().mean()) if drawn.numel() else 0.0
        return totals

    def empty_step(self) -> None:
        """A step whose every sample failed: no update, but the policy version advances with the run's."""
        self.version += 1

    def policy_weights(self) -> dict[str, Tensor]:
        """The whole policy, on every rank (FSDP: a collective, gathered from the shards), or a LoRA policy's adapters
        alone (engines/lora/adapter.py); never one with a NaN."""
        if self.lora is not None:
            from areal.engines.lora.training import adapter_factors

            weights = adapter_factors(self.engine.model)
        else:
            weights = self.engine.state_dict()
        broken = [name for name, t in weights.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
        if broken:
            raise NonFiniteUpdate(f"version {self.version}: weights {', '.join(broken[:3])} hold NaN or inf; "
                                  "they are neither published nor checkpointed")
        return weights

    def save_weights(self, path: str | None) -> None:
        """Write the policy to `path`; None: only take part in gathering it (a trainer rank > 0)."""
        weights = self.policy_weights()
        if path is not None and self.lora is not None:
            from areal.engines.lora import save_adapter

            save_adapter(weights, path, self.base_sha256)
        elif path is not None:
            save_weights(weights, path)

    def save_checkpoint(self, folder: str) -> None:
        self.engine.save(folder, self.version)
        if self.lora is not None:  # the adapter's base, by hash: a resume onto another is refused
            (Path(folder) / BASE_FILE).write_text(json.dumps({"base_sha256": self.base_sha256}) + "\n")

    def _check_base(self, folder: Path) -> None:
        """A LoRA checkpoint resumes only onto the base its adapters were trained on."""
        if self.lora is None:
            return
        saved = json.loads((folder / BASE_FILE).read_text())["base_sha256"] if (folder / BASE_FILE).exists() else None
        if saved != self.base_sha256:
            raise ConfigError(f"{folder} holds LoRA adapters of a base whose weights hash to {saved}, but the run's "
                              f"model hashes to {self.base_sha256}: resume with the model the adapters were "
                              "trained on")


class ProximalNode:
    """log-probs of the output tokens under a model: the colocated trainer's current weights (π_prox, one
    forward pass over the batch before its update), or a frozen model loaded once (a KL reference), or, inside a
    LoRA trainer, that trainer's model with its adapters disabled (the same reference, no second model)."""

    def __init__(self, model: str | None = None, frozen: bool | str = False, output: str = "prox_logp") -> None:
        self.model_name, self.frozen, self.output = model, frozen, output
        self.engine: Any = None
        self.adapters_off = False  # frozen=True inside a LoRA trainer: its model with the adapters disabled

    def setup(self, context: Any) -> None:
        if self.frozen is True and context.pool.role == "train":
            # the compiler put this reference inside a LoRA trainer: its model with the adapters disabled is the
            # run's starting model, so no second model is loaded
            self.trainer_name, self.adapters_off = context.pool.name, True
            return
        if self.frozen:
            from areal.engines.device import torch_device

            config = context.config
            spec = config.model if self.frozen is True else str(self.frozen)
            model, _ = load_run_policy(config.model_copy(update={"model": spec}))
            self.engine = TorchTrainEngine(model, TrainSettings(temperature=config.generation.temperature),
                                           device=torch_device(config.trainer.device))
            return
        self.trainer_name = self.model_name or context.pool.name

    def __call__(self, batch: Batch) -> dict[str, Any]:
        engine, keep = self.engine, False
        sequences, prompt_lens = full_sequences(batch["prompt_ids"], batch["output_ids"])
        if self.adapters_off:
            engine = TRAINERS[self.trainer_name].engine
            with engine.model.disable_adapter():  # a forward of its own, kept for nothing
                logps = engine.sequence_logprobs(sequences)
            return {self.output: Ragged.from_rows([lp[p - 1 :] for lp, p in zip(logps, prompt_lens)],
                                                  dtype=torch.float32)}
        if engine is None:
            trainer = TRAINERS[self.trainer_name]
            if trainer.objective != "decoupled":  # the trainer's own objective, however it was set
                return {self.output: batch["behav_logp"]}  # unused by the update: no forward pass needed
            engine, keep = trainer.engine, trainer.keeps_proximal_forward
        # kept: the update that follows backpropagates through this forward (only a TorchTrainEngine keeps one)
        logps = engine.sequence_logprobs(sequences, keep_for_update=True) if keep else engine.sequence_logprobs(
            sequences)
        return {self.output: Ragged.from_rows([lp[p - 1 :] for lp, p in zip(logps, prompt_lens)],
                                              dtype=torch.float32)}

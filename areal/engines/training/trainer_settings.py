"""What a training engine takes beyond its model, in one value: the optimizer, its lr schedule, the micro-batch
budget, and the temperature its log-probs are taken at (the sampler's, so π_θ is the policy that sampled).

Both train engines (torch, FSDP) and the critic's take it; `engines.train_settings(config)` reads it from a
run's config. The schedule is a pure function of the step, so a checkpoint's step is its whole state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from torch.nn import Module


@dataclass(frozen=True)
class TrainSettings:
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float | None = 1.0  # the gradient's global norm is clipped to this; None: never
    microbatch_tokens: int = 8192  # padded positions one forward may hold (kernels.packing)
    warmup_steps: int = 0
    lr_schedule: Literal["constant", "cosine"] = "constant"
    total_steps: int | None = None  # where a cosine schedule reaches 0
    temperature: float = 1.0
    shared_prefixes: bool = True  # a group's prompt once a row where the model allows (kernels/shared_prefix.py)
    model_dropout: bool = False  # the model's own dropout acts in the update (a LoRA adapter's always does)
    token_entropy: bool = False  # an update's forward also gives π_θ's entropy at each output token: mb["entropy"]

    def __post_init__(self) -> None:
        if self.lr_schedule not in ("constant", "cosine"):
            raise ValueError(f"TrainSettings: lr_schedule must be 'constant' or 'cosine', got {self.lr_schedule!r}")
        if self.lr_schedule == "cosine" and (self.total_steps is None or self.total_steps <= self.warmup_steps):
            raise ValueError(f"TrainSettings: lr_schedule='cosine' needs total_steps > warmup_steps "
                             f"({self.warmup_steps}), got total_steps={self.total_steps}")
        if self.temperature <= 0:
            raise ValueError(f"TrainSettings: temperature must be > 0, got {self.temperature}")

    def lr_at(self, step: int) -> float:
        """The lr at schedule position `step` (0-based): linear warmup, then constant or cosine to 0."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.lr_schedule == "constant":
            return self.lr
        assert self.total_steps is not None
        progress = min(1.0, (step - self.warmup_steps) / (self.total_steps - self.warmup_steps))
        return self.lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def enter_update_mode(model: Module, settings: TrainSettings) -> None:
    """Train mode for an update: without the model's own dropout unless `model_dropout`, so the update's forward
    is the one its behaviour and proximal log-probs were taken with (a dropped-out forward reads as policy change
    in the PPO ratio); a LoRA adapter's dropout is its own setting and acts whenever it is set."""
    model.train(settings.model_dropout)
    for module in model.modules():
        if hasattr(module, "lora_dropout"):
            module.lora_dropout.train()

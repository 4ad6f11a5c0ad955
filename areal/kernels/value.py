"""The critic's loss: regress each token's value on its return, clipped around the values it had.

PPO's value clipping (as in the PPO2 baselines) keeps an update from moving a value by more than
ε from the one the critic gave when the sample was scored, by taking the worse of the clipped and
unclipped squared errors. Inputs are per-token [N] tensors (packed); gradients flow through
`values` only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class ValueStats:
    """Detached numbers of one loss evaluation, for the step's metrics."""

    value_loss: float
    value_clip_fraction: float  # tokens whose clipped error was the larger one
    explained_variance: float  # 1 − Var(returns − values) / Var(returns): 1 is a perfect critic, ≤ 0 none


def clipped_value_loss(values: Tensor, old_values: Tensor, returns: Tensor, *,
                       clip_eps: float | None = 0.2) -> tuple[Tensor, ValueStats]:
    """L = ½ · mean_t max((V_t − R_t)², (V_old,t + clip(V_t − V_old,t, −ε, ε) − R_t)²); ε=None: no clip."""
    if values.dim() != 1 or old_values.shape != values.shape or returns.shape != values.shape:
        raise ValueError(f"clipped_value_loss: values {tuple(values.shape)}, old_values {tuple(old_values.shape)} "
                         f"and returns {tuple(returns.shape)} must all be [N]")
    old_values, returns = old_values.detach().to(values.dtype), returns.detach().to(values.dtype)
    unclipped = (values - returns) ** 2
    if clip_eps is None:
        worst, clipped_active = unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
    else:
        clipped = (old_values + (values - old_values).clamp(-clip_eps, clip_eps) - returns) ** 2
        worst = torch.maximum(unclipped, clipped)
        clipped_active = clipped > unclipped
    loss = 0.5 * worst.mean() if values.numel() else values.sum() * 0.0
    with torch.no_grad():
        spread = returns.var(unbiased=False) if returns.numel() > 1 else returns.new_zeros(())
        residual = (returns - values).var(unbiased=False) if returns.numel() > 1 else returns.new_zeros(())
        explained = float(1 - residual / spread) if float(spread) > 0 else 0.0
        stats = ValueStats(float(loss), float(clipped_active.float().mean()) if values.numel() else 0.0, explained)
    return loss, stats

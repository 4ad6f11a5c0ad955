"""Advantages: compare each sample with its siblings, then spread the result over its tokens.

Outcome rewards are per sample; the PPO loss is per token. Group statistics (GRPO's mean/std,
leave-one-out) are computed with scatter-adds over `torch.unique` group indices, so a batch with
any number of groups of any size is a handful of vector ops. GAE runs over packed sequences,
looping over time steps (not over sequences or tokens). Nothing here reads a model.

Standard deviations use Bessel's correction (n − 1), like torch.std; a group or batch with a
single member has std 0 by definition here (not nan), so its centred value 0 stays 0.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _float(x: Tensor) -> Tensor:
    return x if x.is_floating_point() else x.to(torch.float32)


def _group_mean_std(values: Tensor, group_id: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample (mean, std, count) of the sample's group."""
    if values.dim() != 1 or group_id.shape != values.shape:
        raise ValueError(
            f"group statistics need rewards [S] and group_id [S], got {tuple(values.shape)} and {tuple(group_id.shape)}"
        )
    _, inverse = torch.unique(group_id, return_inverse=True)
    n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    count = torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(
        0, inverse, torch.ones_like(values)
    )
    total = torch.zeros_like(count).index_add_(0, inverse, values)
    mean = (total / count)[inverse]
    # two passes (centre, then square) for accuracy when rewards are large and close together
    sq = torch.zeros_like(count).index_add_(0, inverse, (values - mean) ** 2)
    var = sq / (count - 1).clamp(min=1)
    return mean, var.sqrt()[inverse], count[inverse]


def group_normalise(rewards: Tensor, group_id: Tensor, *, use_std: bool = True, eps: float = 1e-6) -> Tensor:
    """GRPO advantage: (r − mean_g) / (std_g + eps), or r − mean_g with use_std=False.

    rewards [S], group_id [S] of arbitrary ints (groups need not be contiguous or equal-sized).
    """
    rewards = _float(rewards)
    mean, std, _ = _group_mean_std(rewards, group_id)
    centred = rewards - mean
    return centred / (std + eps) if use_std else centred


def leave_one_out(rewards: Tensor, group_id: Tensor) -> Tensor:
    """r minus the mean of the OTHER members of its group (RLOO); 0 for a group of one."""
    rewards = _float(rewards)
    mean, _, count = _group_mean_std(rewards, group_id)
    # r − (Σ_g − r)/(n − 1) = n/(n − 1) · (r − mean_g)
    scale = torch.where(count > 1, count / (count - 1).clamp(min=1), torch.zeros_like(count))
    return scale * (rewards - mean)


def batch_normalise(adv: Tensor, mask: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """(adv − mean) / (std + eps) over the masked entries; entries outside the mask become 0.

    Works per sample [S] or per token [N]: the statistics are over whatever is passed.
    """
    adv = _float(adv)
    keep = torch.ones_like(adv, dtype=torch.bool) if mask is None else mask.bool()
    if keep.shape != adv.shape:
        raise ValueError(f"batch_normalise: mask {tuple(keep.shape)} must match adv {tuple(adv.shape)}")
    n = keep.sum().to(adv.dtype)
    zero = torch.zeros((), dtype=adv.dtype, device=adv.device)
    mean = torch.where(keep, adv, zero).sum() / n.clamp(min=1)
    centred = torch.where(keep, adv - mean, zero)
    std = ((centred**2).sum() / (n - 1).clamp(min=1)).sqrt()
    return centred / (std + eps)


def per_token(values: Tensor, lengths: Tensor) -> Tensor:
    """Broadcast per-sample values [S] to their packed tokens [N = Σ lengths]."""
    lengths = torch.as_tensor(lengths, device=values.device)
    if values.shape[:1] != lengths.shape or lengths.dim() != 1:
        raise ValueError(f"per_token: values {tuple(values.shape)} and lengths {tuple(lengths.shape)} must both be [S]")
    return torch.repeat_interleave(values, lengths.long(), dim=0)


def gae(
    rewards: Tensor, values: Tensor, cu_seqlens: Tensor, *, gamma: float = 1.0, lam: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation on packed sequences: (advantages [N], returns [N]).

    δ_t = r_t + γ V_{t+1} − V_t, A_t = δ_t + γλ A_{t+1}, returns = A + V. Every sequence ends in a
    terminal state: V after its last token is 0 (no bootstrap for truncated sequences).
    The loop runs over time steps of the longest sequence, vectorised over sequences.
    """
    rewards, values = _float(rewards), _float(values).to(_float(rewards).dtype)
    n = rewards.shape[0]
    if rewards.dim() != 1 or values.shape != rewards.shape:
        raise ValueError(f"gae: rewards {tuple(rewards.shape)} and values {tuple(values.shape)} must be [N]")
    if cu_seqlens.dim() != 1 or len(cu_seqlens) == 0 or int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != n:
        raise ValueError(f"gae: cu_seqlens must start at 0 and end at N={n}, got {cu_seqlens.tolist()}")
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(rewards.device)
    if n == 0:
        return rewards.clone(), rewards.clone()
    max_len = int(lengths.max())
    row = torch.repeat_interleave(torch.arange(len(lengths), device=rewards.device), lengths)
    col = torch.arange(n, device=rewards.device) - cu_seqlens[:-1].to(rewards.device)[row]
    # zero padding past each end makes V_{T} = 0 and A_{T} = 0 without special cases
    padded_r = rewards.new_zeros(len(lengths), max_len + 1)
    padded_v = rewards.new_zeros(len(lengths), max_len + 1)
    padded_r[row, col] = rewards
    padded_v[row, col] = values
    padded_a = rewards.new_zeros(len(lengths), max_len + 1)
    for t in range(max_len - 1, -1, -1):
        delta = padded_r[:, t] + gamma * padded_v[:, t + 1] - padded_v[:, t]
        padded_a[:, t] = delta + gamma * lam * padded_a[:, t + 1]
    advantages = padded_a[row, col]
    return advantages, advantages + values

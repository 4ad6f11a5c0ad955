"""The decoupled PPO objective (AReaL) and its standard-PPO special case.

Three policies meet per token t: π_behav wrote the token (its logprob was recorded at
generation, possibly several versions ago), π_prox is the trainer's policy at the start of this
update, π_θ is the policy being optimised. The importance weight w_t = π_prox / π_behav corrects
for staleness outside the trust region; the clipped ratio u_t = π_θ / π_prox keeps each update
proximal to a recent policy rather than to a stale one. With π_prox = π_behav, w_t = 1 and the
loss is exactly standard PPO.

All inputs are per-token [N] tensors (packed, no padding). This module computes the loss only;
it does not pick the minibatches or call the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class PPOStats:
    """Detached summary of one loss evaluation (plain Python numbers, ready for metrics)."""

    loss: float
    clip_fraction: float  # kept tokens whose clipped term was the active one
    importance_weight_mean: float  # w over valid tokens, before the cap
    importance_weight_max: float
    capped_tokens: int  # valid tokens with w > cap, masked out of the loss
    approx_kl: float  # mean(log π_prox − log π_θ) over kept tokens
    valid_tokens: int = 0
    dual_clip_fraction: float | None = None  # None unless dual_clip is set
    kl_to_ref: float | None = None  # mean k3 KL(π_θ ‖ π_ref) over valid tokens; None without ref_logp
    entropy: float | None = None  # mean entropy of π_θ over valid tokens; None without `entropy`


def decoupled_ppo_loss(
    logp: Tensor,
    prox_logp: Tensor,
    behav_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    behav_weight_cap: float | None = 5.0,
    dual_clip: float | None = None,
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, PPOStats]:
    """L = −Σ_t w_t · min(u_t A_t, clip(u_t, 1−ε, 1+ε_high) A_t) / (number of valid tokens).

    ε_high is `clip_eps_high` (DAPO's clip-higher: a token's probability may rise further than it may fall),
    else ε. w_t = π_prox / π_behav carries no gradient; tokens with w_t > behav_weight_cap are masked out
    (not clipped) and counted. u_t = π_θ / π_prox. With dual_clip = c > 1, a token with A_t < 0
    has its objective floored at c·A_t, so its loss term is at most −c·A_t (Ye et al., 2020).
    With ref_logp, kl_coef · k3 is added, k3 = π_ref/π_θ − log(π_ref/π_θ) − 1 per valid token.
    With `entropy` (π_θ's at each token, with its gradient), entropy_coef · H is subtracted per valid token: a
    bonus that keeps the policy from collapsing onto one answer. Gradients flow through logp and entropy only.
    With `cu_seqlens` [S+1] (sample j's tokens are cu_seqlens[j]:cu_seqlens[j+1]) the ratio is GSPO's, one per
    sample: u_t = s_j · π_θ(t)/sg[π_θ(t)], s_j = exp(mean over j's kept tokens of log π_θ/π_prox) (Zheng et al.
    2025, GSPO-token); clipped as a sample, its gradient still each token's.
    """
    if logp.dim() != 1:
        raise ValueError(f"decoupled_ppo_loss: logp must be per-token [N], got shape {tuple(logp.shape)}")
    n = logp.shape[0]
    optional = (("ref_logp", ref_logp), ("entropy", entropy))
    for name, t in (("prox_logp", prox_logp), ("behav_logp", behav_logp), ("advantages", advantages), ("mask", mask),
                    *((k, v) for k, v in optional if v is not None)):
        if t.shape != logp.shape:
            raise ValueError(f"decoupled_ppo_loss: {name} has shape {tuple(t.shape)}, expected [N]={n} like logp")
    if not 0 < clip_eps < 1:
        raise ValueError(f"decoupled_ppo_loss: clip_eps must be in (0, 1), got {clip_eps}")
    if clip_eps_high is not None and clip_eps_high <= 0:
        raise ValueError(f"decoupled_ppo_loss: clip_eps_high must be > 0 or None, got {clip_eps_high}")
    if behav_weight_cap is not None and behav_weight_cap <= 0:
        raise ValueError(f"decoupled_ppo_loss: behav_weight_cap must be > 0 or None, got {behav_weight_cap}")
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"decoupled_ppo_loss: dual_clip must be > 1 (e.g. 3.0) or None, got {dual_clip}")

    valid = mask.bool()
    prox_logp = prox_logp.detach()
    adv = advantages.detach().to(logp.dtype)
    w = torch.exp(prox_logp - behav_logp.detach()).to(logp.dtype)
    capped = valid & (w > behav_weight_cap) if behav_weight_cap is not None else torch.zeros_like(valid)
    kept = valid & ~capped
    # divide by the valid tokens counted BEFORE the cap: masking a stale token lowers its weight in
    # this batch to 0 rather than re-weighting every other token up (AReaL counts the same way)
    n_valid = valid.sum()
    denom = n_valid.clamp(min=1).to(logp.dtype)

    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    # mask with torch.where BEFORE exp and products: a masked token's ratio may overflow to inf, and
    # where() backward would still send 0 · inf = nan into logp
    log_u = torch.where(kept, logp - prox_logp, zero)
    token_log_u = log_u.detach()
    if cu_seqlens is not None:
        log_u = torch.where(kept, _sample_mean(token_log_u, kept, cu_seqlens) + logp - logp.detach(), zero)
    u = torch.exp(log_u)
    unclipped = u * adv
    clipped = torch.clamp(u, 1.0 - clip_eps, 1.0 + (clip_eps if clip_eps_high is None else clip_eps_high)) * adv
    objective = torch.minimum(unclipped, clipped)
    dual_active = None
    if dual_clip is not None:
        floor = dual_clip * adv
        dual_active = (adv < 0) & (objective < floor)
        objective = torch.where(dual_active, floor, objective)
    loss = -(torch.where(kept, w, zero) * objective).sum() / denom

    kl_to_ref = None
    if ref_logp is not None:
        log_ref_ratio = torch.where(valid, ref_logp.detach() - logp, zero)
        kl_sum = (torch.exp(log_ref_ratio) - log_ref_ratio - 1.0).sum()
        loss = loss + kl_coef * kl_sum / denom
        kl_to_ref = float(kl_sum.detach()) / max(int(n_valid), 1)

    mean_entropy = None
    if entropy is not None:
        entropy_sum = torch.where(valid, entropy.to(logp.dtype), zero).sum()
        if entropy_coef:
            loss = loss - entropy_coef * entropy_sum / denom
        mean_entropy = float(entropy_sum.detach()) / max(int(n_valid), 1)

    with torch.no_grad():
        n_kept = max(int(kept.sum()), 1)
        n_valid_int = int(n_valid)
        w_valid = w[valid]
        stats = PPOStats(
            loss=float(loss.detach()),
            clip_fraction=int((kept & (clipped < unclipped)).sum()) / n_kept,
            importance_weight_mean=float(w_valid.mean()) if n_valid_int else 0.0,
            importance_weight_max=float(w_valid.max()) if n_valid_int else 0.0,
            capped_tokens=int(capped.sum()),
            approx_kl=float(-token_log_u.sum()) / n_kept,
            valid_tokens=n_valid_int,
            dual_clip_fraction=int((kept & dual_active).sum()) / n_kept if dual_active is not None else None,
            kl_to_ref=kl_to_ref,
            entropy=mean_entropy,
        )
    return loss, stats


def _sample_mean(values: Tensor, kept: Tensor, cu_seqlens: Tensor) -> Tensor:
    """Each token's sample's mean of `values` over its kept tokens (0 where a sample keeps none), per token [N]."""
    if cu_seqlens.dim() != 1 or int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != values.shape[0]:
        raise ValueError(f"decoupled_ppo_loss: cu_seqlens must run from 0 to N={values.shape[0]}, got "
                         f"{cu_seqlens.tolist()[:8]}")
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(values.device)
    sample = torch.repeat_interleave(torch.arange(len(lengths), device=values.device), lengths)
    zeros = torch.zeros(len(lengths), dtype=values.dtype, device=values.device)
    sums = zeros.index_add(0, sample, values)
    counts = zeros.index_add(0, sample, kept.to(values.dtype))
    return (sums / counts.clamp(min=1))[sample]


LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def sample_weights(tokens: Tensor, agg: str, max_tokens: int) -> Tensor:
    """Each sample's weight on its tokens' terms, so the token-weighted mean a trainer takes is the `agg` mean.

    `tokens`: each sample's trained tokens [S]. Over N = Σ tokens, a token-mean divides each term by N; weighing a
    sample's terms by N / (S · n_i) gives the mean of the samples' means (seq-mean-token-mean), by N / (S · L)
    the mean of their sums over L = `max_tokens` (seq-mean-token-sum, Dr. GRPO). S counts samples with tokens.
    """
    if agg not in LOSS_AGGREGATIONS:
        raise ValueError(f"sample_weights: loss aggregation must be one of {LOSS_AGGREGATIONS}, got {agg!r}")
    counted = int((tokens > 0).sum())
    if agg == "token-mean" or counted == 0:
        return torch.ones(tokens.shape, dtype=torch.float64)
    per_sample = (tokens.clamp(min=1).to(torch.float64) if agg == "seq-mean-token-mean"
                  else torch.full(tokens.shape, float(max_tokens), dtype=torch.float64))
    return tokens.sum().to(torch.float64) / (counted * per_sample)


def standard_ppo_loss(
    logp: Tensor, behav_logp: Tensor, advantages: Tensor, mask: Tensor, **kw: object
) -> tuple[Tensor, PPOStats]:
    """Standard clipped PPO: the decoupled loss with π_prox = π_behav (w = 1, no proximal pass)."""
    return decoupled_ppo_loss(logp, behav_logp, behav_logp, advantages, mask, **kw)  # type: ignore[arg-type]


def approx_prox_logp(behav_logp: Tensor, logp: Tensor, behav_versions: Tensor, current_version: int) -> Tensor:
    """log π_prox ≈ log π_behav + α (log π_θ − log π_behav), α = (v_θ − 1 − v_behav) / (v_θ − v_behav).

    Skips the proximal forward pass by interpolating in version space. `current_version` is v_θ,
    the version this update will publish; π_prox is version v_θ − 1 (the weights at the update's
    start). Per token, by v_behav:
      v_behav = v_θ − 1: α = 0, the token came from π_prox itself, so the result is exact;
      v_behav ≪ v_θ: α → 1, π_prox ≈ π_θ;
      v_behav = v_θ: the formula is −1/0; such a token is on-policy for π_θ, α = 0 (π_prox = π_behav);
      v_behav > v_θ: a token from the future is a version bookkeeping bug: ValueError.
    No gradient flows through the result.
    """
    if behav_versions.shape != behav_logp.shape or logp.shape != behav_logp.shape:
        raise ValueError(
            f"approx_prox_logp: behav_logp {tuple(behav_logp.shape)}, logp {tuple(logp.shape)} and "
            f"behav_versions {tuple(behav_versions.shape)} must have the same shape"
        )
    versions = behav_versions.long()
    if versions.numel() and int(versions.max()) > current_version:
        raise ValueError(
            f"approx_prox_logp: {int((versions > current_version).sum())} token(s) carry version "
            f"up to {int(versions.max())}, newer than current_version={current_version}; "
            "current_version must be the version this update publishes (weights version + 1)"
        )
    gap = (current_version - versions).to(behav_logp.dtype)  # v_θ − v_behav ≥ 0
    alpha = torch.where(gap > 0, (gap - 1) / gap.clamp(min=1), torch.zeros_like(gap))
    behav = behav_logp.detach()
    return behav + alpha * (logp.detach() - behav)

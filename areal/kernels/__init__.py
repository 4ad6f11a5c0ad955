"""The numerics of RL training: token logprobs, the decoupled PPO loss, advantages, packing.

Pure torch, device-agnostic, no Python loops over tokens. Checked against float64 references
(tests/kernels).

May import: no other part of areal but the leaves areal.config, areal.overrides, areal.errors.
"""

from __future__ import annotations

from areal.kernels.advantage import batch_normalise, gae, group_normalise, leave_one_out, per_token
from areal.kernels.logprob import next_token_logprobs, token_logprobs
from areal.kernels.packing import PackingError, balance_across_ranks, pack_microbatches, padding_waste
from areal.kernels.ppo import PPOStats, approx_prox_logp, decoupled_ppo_loss, standard_ppo_loss
from areal.kernels.value import ValueStats, clipped_value_loss

__all__ = [
    "PPOStats",
    "PackingError",
    "ValueStats",
    "approx_prox_logp",
    "balance_across_ranks",
    "batch_normalise",
    "clipped_value_loss",
    "decoupled_ppo_loss",
    "gae",
    "group_normalise",
    "leave_one_out",
    "next_token_logprobs",
    "pack_microbatches",
    "padding_waste",
    "per_token",
    "standard_ppo_loss",
    "token_logprobs",
]

"""Code RL with a KL penalty to the starting policy, computed beside the reward.

    areal run recipes/kl_rl.py

A frozen copy of the starting model scores each sample's tokens (`ref_logp`) in a branch of its
own, in parallel with the sandboxed reward; the two branches meet at the advantage node, which
shapes each reward with a per-sample KL estimate (Schulman's k3, averaged over the sample's
tokens) before normalising within the group. The step metrics report the mean KL (`kl`).
"""

import torch

from areal import Float, Graph, Int, RunConfig, node
from areal.data import code_tasks
from areal.graph.roles import METRICS
from areal.kernels.advantage import group_normalise
from areal.nodes import compute_logprob, generate, ppo_update, reward
from areal.rewards import code_tests

config = RunConfig(model="builtin:tiny-coder", batch_size=16, group_size=8, staleness=2, steps=120)
KL_COEF = 0.05  # β: reward − β · KL(π_behav ‖ π_ref) per sample


@node(
    inputs={"reward": Float["S"], "group_id": Int["S"], "behav_logp": Float["S", "T"], "ref_logp": Float["S", "T"]},
    outputs={"advantage": Float["S"], "kl": Float["S"]},
)
def kl_advantage(batch):
    """GRPO on the KL-shaped reward. The KL per sample is the mean over its tokens of Schulman's k3 estimate,
    exp(r) - r - 1 with r = log π_ref - log π_behav: unbiased for KL(π_behav ‖ π_ref), and never negative."""
    r = batch["ref_logp"].values - batch["behav_logp"].values
    per_token = torch.expm1(r) - r
    per_sample = batch["behav_logp"].lengths.clamp(min=1).to(per_token.dtype)
    kl = per_token.new_zeros(batch.size).index_add_(0, batch["behav_logp"].sample_index(), per_token) / per_sample
    shaped = batch["reward"] - KL_COEF * kl
    return {"advantage": group_normalise(shaped, batch["group_id"]), "kl": kl,
            METRICS: {"kl": float(kl.mean()), "kl_shaping": float((KL_COEF * kl).abs().mean())}}


g = Graph("kl-rl")
g.source("tasks", code_tasks("train"), heldout=code_tasks("test"))  # task_id, prompt, tests
g.add(generate("rollout"), pool=1)  # prompt_ids, output_ids, behav_logp, versions, completion, truncated
g.add(reward("score", code_tests(timeout_s=2.0)), pool=1)  # reward           } two branches,
g.add(compute_logprob("reference", frozen=True, output="ref_logp"))  # ref_logp  } side by side
g.add(kl_advantage)  # advantage, kl: joins the two branches
g.add(compute_logprob("proximal"))  # prox_logp
g.add(ppo_update("actor"))  # steps the optimizer, publishes version + 1

"""Code RL with LoRA adapters, and a KL penalty to the starting policy that costs no second model.

    areal run recipes/lora_rl.py

The trainer trains rank-8 LoRA adapters on every linear layer of the tiny coder (peft); the base stays frozen, the
optimizer holds the adapters' moments only, and each version travels to the generator as the adapters' factors
alone (a tenth of the weights here, a few MB of a 7B model's GBs: docs/design-notes.md, "LoRA"). The generator
merges them into its copy of the base. The KL reference is declared as in kl_rl.py, but for a LoRA policy the
compiler runs it inside the trainer: the trainer's own model with the adapters disabled is the starting policy,
so the reference (and the advantage that reads it) run in the trainer's process on the model it already holds.
Every step checks that the generator samples the version it says it does (the mismatch alarm, docs/metrics.md).
`--set nodes.actor.lora.rank=32` changes the rank; `areal export RUN_DIR OUT` writes the adapter as a PEFT directory.
"""

import torch

from areal import Float, Graph, Int, RunConfig, node
from areal.config import EvalConfig, GenerationConfig, LoraConfig
from areal.data import code_tasks
from areal.graph.roles import METRICS
from areal.kernels.advantage import group_normalise
from areal.nodes import compute_logprob, generate, ppo_update, reward
from areal.rewards import code_tests

config = RunConfig(model="builtin:tiny-coder", batch_size=16, group_size=8, staleness=1, steps=144,
                   generation=GenerationConfig(max_batch=128), eval=EvalConfig(interval_steps=72, samples=8))
KL_COEF = 0.02  # β: reward − β · KL(π_behav ‖ π_ref) per sample


@node(
    inputs={"reward": Float["S"], "group_id": Int["S"], "behav_logp": Float["S", "T"], "ref_logp": Float["S", "T"]},
    outputs={"advantage": Float["S"]},
)
def kl_advantage(batch):
    """GRPO on the KL-shaped reward: per sample, the mean over its tokens of k3 = exp(r) − r − 1, r = log π_ref −
    log π_behav (unbiased for KL(π_behav ‖ π_ref), never negative)."""
    r = batch["ref_logp"].values - batch["behav_logp"].values
    per_token = torch.expm1(r) - r
    per_sample = batch["behav_logp"].lengths.clamp(min=1).to(per_token.dtype)
    kl = per_token.new_zeros(batch.size).index_add_(0, batch["behav_logp"].sample_index(), per_token) / per_sample
    return {"advantage": group_normalise(batch["reward"] - KL_COEF * kl, batch["group_id"]),
            METRICS: {"kl": float(kl.mean())}}


g = Graph("lora-rl")
g.source("tasks", code_tasks("train"), heldout=code_tasks("test"))  # task_id, prompt, tests
g.add(generate("rollout"), pool=1)  # prompt_ids, output_ids, behav_logp, versions, completion, truncated
g.add(reward("score", code_tests(timeout_s=2.0)), pool=1)  # reward
g.add(compute_logprob("reference", frozen=True, output="ref_logp"))  # ref_logp: the actor's model, adapters off
g.add(kl_advantage)  # advantage (in the trainer's process: it reads the reference)
g.add(compute_logprob("proximal"))  # prox_logp
g.add(ppo_update("actor", lora=LoraConfig(rank=8, alpha=16), lr=2e-3))  # trains the adapters, publishes them

"""Math RL on emulated H100s: the runtime's own overhead and scaling, with no model.   areal run recipes/emulated_rl.py

The graph of recipes/math_rl.py, with both engines emulated: generation and training take the
modelled time of a 1.5B model on one H100 each (areal/engines/emulated/profiles/h100-qwen2.5-1.5b.json)
and compute nothing, so everything else (the source and the staleness gate, the reward pool, the
joins, the trainer's batches, weights publication, the controller) runs as it would beside GPUs.
Output lengths are log-normal around `emulation.output_tokens_median`. The completions are random
bytes, so every reward is 0 and nothing is learnt: this recipe measures the runtime, not a policy.
More generators: `--set 'placement={"rollout": 8}'`; trainer ranks: `--set trainer.ranks=2`;
ten times faster than the modelled devices: `--set emulation.time_scale=0.1`.
"""

from areal import Float, Graph, Int, RunConfig, node
from areal.data import math_tasks
from areal.kernels.advantage import leave_one_out
from areal.nodes import compute_logprob, generate, ppo_update, reward
from areal.rewards import math_reward

config = RunConfig(
    batch_size=8,
    group_size=8,
    staleness=2,
    steps=20,
    generation={"engine": "emulated", "max_new_tokens": 8192, "max_batch": 128, "stop": []},
    trainer={"engine": "emulated"},
    emulation={"output_tokens_median": 1024, "output_tokens_sigma": 0.6},
    checkpoint={"interval_steps": 0},
)


@node(inputs={"reward": Float["S"], "group_id": Int["S"]}, outputs={"advantage": Float["S"]})
def loo_advantage(batch):
    """RLOO: each reward minus the mean of its siblings' rewards."""
    return {"advantage": leave_one_out(batch["reward"], batch["group_id"])}


g = Graph("emulated-rl")
g.source("tasks", math_tasks("train"))  # task_id, prompt, answer
g.add(generate("rollout"), pool=1)  # prompt_ids, output_ids, behav_logp, versions, completion, truncated
g.add(reward("score", math_reward(timeout_s=2.0)), pool=1)  # reward
g.add(loo_advantage)  # advantage
g.add(compute_logprob("proximal"))  # prox_logp
g.add(ppo_update("actor"))  # publishes version + 1 after the modelled update

"""Math RL on arithmetic problems or your own, fully asynchronous.   areal run recipes/math_rl.py

The policy answers each problem G times; `math_reward` takes the last \\boxed{} (or "Answer: X")
of each completion, refuses hedged answers and answers that restate the prompt, and judges the
rest against the reference with math-verify, numbers compared exactly, in a child process killed
at the time limit (docs/math.md); leave-one-out (RLOO) advantages feed a decoupled PPO update.
Your own data and model: `--set data.path=problems.jsonl --set model=/path/to/hf-checkpoint`,
one {"problem": ..., "answer": ...} per line (docs/data.md), and a longer
`--set generation.max_new_tokens=1024`. Without `data.path` it trains on built-in arithmetic
with the built-in `tiny-mather`, the tiny coder's shape warm-started on the arithmetic's train
split: it answers about two held-out problems in five at the start.
"""

from areal import Float, Graph, Int, RunConfig, node
from areal.config import GenerationConfig, TrainerConfig
from areal.data import math_tasks
from areal.kernels.advantage import leave_one_out
from areal.nodes import compute_logprob, generate, ppo_update, reward
from areal.rewards import math_reward

# no stop strings (the math tasks have none; the code tasks' "\n#" would cut a "#### 42" answer): a completion
# ends at eos or the length (the longest worked answer is 100 characters). lr 1e-4, not the code recipe's 3e-4:
# on the tiny mather 3e-4 moved held-out pass@1 by -4.9, -1.2 and +0.2 points in 40 steps (3 seeds); 1e-4 gains
# 7-9 points in 100 (docs/math.md)
config = RunConfig(
    model="builtin:tiny-mather",
    batch_size=8,
    group_size=8,
    staleness=2,
    steps=100,
    generation=GenerationConfig(stop=[], max_new_tokens=128),
    trainer=TrainerConfig(lr=1e-4),
)


@node(inputs={"reward": Float["S"], "group_id": Int["S"]}, outputs={"advantage": Float["S"]})
def loo_advantage(batch):
    """RLOO: each reward minus the mean of its siblings' rewards (no std scaling: exact answers are 0/1)."""
    return {"advantage": leave_one_out(batch["reward"], batch["group_id"])}


g = Graph("math-rl")
g.source("tasks", math_tasks("train"), heldout=math_tasks("test"))  # task_id, prompt, answer
g.add(generate("rollout"), pool=1)  # prompt_ids, output_ids, behav_logp, versions, completion, truncated
g.add(reward("score", math_reward(timeout_s=2.0, use_prompt=True)), pool=1)  # reward
g.add(loo_advantage)  # advantage
g.add(compute_logprob("proximal"))  # prox_logp
g.add(ppo_update("actor"))  # steps the optimizer, publishes version + 1

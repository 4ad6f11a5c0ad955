"""Code RL on the built-in tasks, fully asynchronous.   areal run recipes/code_rl.py

The built-in tiny coder (shipped in the package, the same on every machine) writes Python
function bodies; a sandbox runs them against hidden tests; GRPO-style group advantages feed a
decoupled PPO update; every new policy version reaches generation between decode steps. `--mode sync` is the baseline.
Your own data and model: `--set data.path=tasks.jsonl --set model=/path/to/hf-checkpoint`.
"""

from areal import Float, Graph, Int, RunConfig, node
from areal.config import EvalConfig, GenerationConfig
from areal.data import code_tasks
from areal.kernels.advantage import group_normalise
from areal.nodes import compute_logprob, generate, ppo_update, reward
from areal.rewards import code_tests

# held-out pass@1 at the start, half-way and the end, 8 samples of each of the 237 held-out tasks: a standard
# error under 1 point, so a round's change is the policy's, not the sampling's (a round costs the two cores
# about 20 s; one fewer in the middle buys 7 steps). η = 1: the trainer was the bottleneck on 2 cores, so the
# generator runs the full η ahead; at η = 2 nearly every sample was trained 2 versions old and the run gained
# less in the same wall time. A batch of 128 rows decodes 1.7x the tokens per CPU second of 32 on this model,
# which leaves the trainer more of the two cores (docs/benchmarks.md, "The first run")
config = RunConfig(model="builtin:tiny-coder", batch_size=16, group_size=8, staleness=1, steps=144,
                   generation=GenerationConfig(max_batch=128), eval=EvalConfig(interval_steps=72, samples=8))


@node(inputs={"reward": Float["S"], "group_id": Int["S"]}, outputs={"advantage": Float["S"]})
def group_advantage(batch):
    """GRPO: centre each reward on its prompt group and scale by the group's spread."""
    return {"advantage": group_normalise(batch["reward"], batch["group_id"])}


g = Graph("code-rl")
g.source("tasks", code_tasks("train"), heldout=code_tasks("test"))  # task_id, prompt, tests
g.add(generate("rollout"), pool=1)  # prompt_ids, output_ids, behav_logp, versions, completion, truncated
g.add(reward("score", code_tests(timeout_s=2.0)), pool=1)  # reward
g.add(group_advantage)  # advantage
g.add(compute_logprob("proximal"))  # prox_logp
g.add(ppo_update("actor"))  # steps the optimizer, publishes version + 1

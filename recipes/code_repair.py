"""Multi-turn code repair on the built-in tasks: the model sees its failures and tries again.

    areal run recipes/code_repair.py

Each sample is an episode (`repair` below): the model writes a body; the sandbox runs the task's
public tests on it; while they fail and turns remain, the model reads the first failure and writes
the body again. The reward is the fraction of the hidden tests the last body passes. Only the
model's own tokens are trained (the loss mask); the feedback lines are context. The built-in
`tiny-repairer` is the tiny coder warm-started also on repair examples (a wrong body, its
feedback, the fix), so that reading feedback is something it can learn to use.
`recipes/code_repair_openai.py` is the same agent written against the OpenAI-compatible endpoint.
"""

import asyncio

from areal import Float, Graph, Int, RunConfig, node
from areal.data import code_tasks
from areal.data.code_repair import feedback, split_tests
from areal.kernels.advantage import group_normalise
from areal.nodes import compute_logprob, episode, ports, ppo_update
from areal.rewards import code_tests

TURNS = 3  # attempts per episode: the first, and up to two repairs
config = RunConfig(model="builtin:tiny-repairer", batch_size=16, group_size=8, staleness=2, steps=60)
judge = code_tests(timeout_s=2.0)


async def repair(task, llm):
    """Write, test on the public tests, repair with their failure; the reward is the hidden tests."""
    public, hidden = split_tests(task["tests"])
    reply = await llm.generate(task["prompt"])
    for _ in range(TURNS - 1):
        check = await asyncio.to_thread(judge.score, task["prompt"] + reply.text, public)
        if check.reason is None:
            break
        reply = await llm.generate(feedback(check, task["prompt"]))
    final = await asyncio.to_thread(judge.score, task["prompt"] + reply.text, hidden)
    return final.reward


@node(inputs={"reward": Float["S"], "group_id": Int["S"]}, outputs={"advantage": Float["S"]})
def group_advantage(batch):
    """GRPO: centre each reward on its prompt group and scale by the group's spread."""
    return {"advantage": group_normalise(batch["reward"], batch["group_id"])}


g = Graph("code-repair")
g.source("tasks", code_tasks("train"), heldout=code_tasks("test"))  # task_id, prompt, tests
g.add(episode("repair", repair, inputs={"prompt": ports.PROMPT, "tests": ports.TESTS}, max_new_tokens=48),
      pool=1)  # prompt_ids, output_ids, loss_mask, behav_logp, versions, reward, turns
g.add(group_advantage)  # advantage
g.add(compute_logprob("proximal"))  # prox_logp
g.add(ppo_update("actor"))  # masked by loss_mask: feedback tokens are not trained

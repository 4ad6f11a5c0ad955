"""A small RL recipe on a real model: the built-in generate, proximal and PPO nodes, a text reward.

The model is a tiny local checkpoint the test writes (`--set model=DIR`). The reward is a pure
function of the completion text (its share of vowels), so it varies between siblings and the
update moves the weights, with no sandbox and no timing in the loop.
"""

import torch

from areal import Float, Graph, Int, Json, RunConfig, node
from areal.kernels.advantage import group_normalise
from areal.nodes import compute_logprob, generate, ppo_update

PROMPTS = ["# add 1 to x\ndef f(x):\n", "# double x\ndef f(x):\n", "# negate x\ndef f(x):\n"]


class Prompts:
    """The prompts in a fixed cycle, resumable."""

    fields = ("prompt",)

    def __init__(self):
        self.i = 0

    def __iter__(self):
        while True:
            self.i += 1
            yield {"prompt": PROMPTS[(self.i - 1) % len(PROMPTS)]}

    def state(self):
        return {"i": self.i}

    def restore(self, state):
        self.i = state["i"]


@node(inputs={"completion": Json["S"]}, outputs={"reward": Float["S"]})
def vowels(batch):
    return {"reward": torch.tensor([sum(c in "aeiou" for c in t) / max(len(t), 1) for t in batch["completion"]])}


@node(inputs={"reward": Float["S"], "group_id": Int["S"]}, outputs={"advantage": Float["S"]})
def advantage(batch):
    return {"advantage": group_normalise(batch["reward"], batch["group_id"])}


config = RunConfig(mode="sync", batch_size=2, group_size=3, steps=4, trainer={"lr": 1e-3},
                   generation={"max_new_tokens": 8}, checkpoint={"interval_steps": 2})
g = Graph("tiny-rl")
g.source("tasks", Prompts())
g.add(generate("rollout"))  # prompt_ids, output_ids, behav_logp, versions, completion, truncated
g.add(vowels)  # reward
g.add(advantage)  # advantage
g.add(compute_logprob("proximal"))  # prox_logp
g.add(ppo_update("actor"))  # publishes version + 1

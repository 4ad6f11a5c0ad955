"""Code RL with dynamic sampling (DAPO): groups that teach nothing are dropped and replaced.

    areal run recipes/dapo_rl.py

A group whose samples all earn the same reward (all pass, or all fail) has zero advantage: it
costs a trainer step's share and moves nothing. A filter node drops such groups whole; the
runtime counts them `filtered`, frees their staleness slots, and the source admits new groups,
so every step still trains B groups that carry signal. Held-out rounds pass the filter untouched.
"""

import torch

from areal import Float, Graph, Int, RunConfig, node
from areal.data import code_tasks
from areal.graph.roles import DROPPED
from areal.kernels.advantage import group_normalise
from areal.nodes import compute_logprob, generate, ppo_update, reward
from areal.rewards import code_tests

config = RunConfig(model="builtin:tiny-coder", batch_size=16, group_size=8, staleness=2, steps=120)


@node(inputs={"reward": Float["S"], "group_id": Int["S"]}, outputs={}, role="filter")
def informative_groups(batch):
    """Drop every group whose rewards are all equal: its advantages would all be 0."""
    rewards, groups = batch["reward"], batch["group_id"]
    dropped = {}
    for group in groups.unique().tolist():
        rows = torch.nonzero(groups == group).flatten().tolist()
        if bool((rewards[rows] == rewards[rows[0]]).all()):
            dropped.update(dict.fromkeys(rows, f"every reward of group {group} is {float(rewards[rows[0]]):g}"))
    return {DROPPED: dropped}


@node(inputs={"reward": Float["S"], "group_id": Int["S"]}, outputs={"advantage": Float["S"]})
def group_advantage(batch):
    """GRPO: centre each reward on its prompt group and scale by the group's spread."""
    return {"advantage": group_normalise(batch["reward"], batch["group_id"])}


g = Graph("dapo-rl")
g.source("tasks", code_tasks("train"), heldout=code_tasks("test"))  # task_id, prompt, tests
g.add(generate("rollout"), pool=1)  # prompt_ids, output_ids, behav_logp, versions, completion, truncated
g.add(reward("score", code_tests(timeout_s=2.0)), pool=1)  # reward
g.add(informative_groups)  # drops groups of equal rewards (counted as filtered; the source refills)
g.add(group_advantage)  # advantage
g.add(compute_logprob("proximal"))  # prox_logp
g.add(ppo_update("actor"))  # steps the optimizer, publishes version + 1

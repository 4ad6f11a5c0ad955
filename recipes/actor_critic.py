"""Code RL with a learned critic: PPO with GAE, two models trained side by side.

    areal run recipes/actor_critic.py

A critic (the warm-started model with a value head, models/value.py) scores every state of each
sample in a pool of its own, beside the sandboxed reward; GAE turns the outcome reward and those
values into one advantage and one return per token. The actor trains on the advantages, the
critic on the returns: two trainers, each with its own version, weights route (the actor's to
generation, the critic's to the values pool) and checkpoint part. The step metrics carry the
critic's numbers prefixed `critic_` (its loss, explained variance, clipped fraction).
"""

from areal import Graph, RunConfig
from areal.data import code_tasks
from areal.nodes import compute_logprob, generate, ppo_update, reward
from areal.nodes.critic import compute_values, gae_advantage, value_update
from areal.rewards import code_tests

config = RunConfig(model="builtin:tiny-coder", batch_size=16, group_size=8, staleness=2, steps=120)

g = Graph("actor-critic")
g.source("tasks", code_tasks("train"), heldout=code_tasks("test"))  # task_id, prompt, tests
g.add(generate("rollout", model="actor"), pool=1)  # prompt_ids, output_ids, behav_logp, versions, completion, truncated
g.add(reward("score", code_tests(timeout_s=2.0)), pool=1)  # reward                 } two branches,
g.add(compute_values("values", model="critic"), pool=1)  # values (the critic's)   } side by side
g.add(gae_advantage("gae", gamma=1.0, lam=0.95))  # advantage, returns per token: joins them
g.add(compute_logprob("proximal", model="actor"))  # prox_logp
g.add(ppo_update("actor", token_advantages=True))  # the policy, on per-token advantages
g.add(value_update("critic", lr=1e-4))  # the critic, on the returns

"""The built-in node kinds a recipe declares its RL loop with.

May import: areal.graph, areal.engines, areal.kernels, areal.models, areal.rewards, areal.data,
areal.nodes.workers, areal.nodes.episodes (and the leaves areal.config, areal.overrides, areal.errors).
"""

from areal.nodes.compute_logprob import compute_logprob
from areal.nodes.episode import episode
from areal.nodes.generate import generate
from areal.nodes.ppo_update import ppo_update
from areal.nodes.reward import reward

__all__ = ["compute_logprob", "episode", "generate", "ppo_update", "reward"]

"""tiny_rl.py with a fault injected: its generator skips the weight update of version 2 (it notes the version and
keeps sampling with version 1's weights), the silent failure the mismatch alarm is for.

Its reward breaks ties by a sample's place in the batch, so no step has every advantage 0: a LoRA adapter fed
only zero advantages does not move (Adam steps 0, and weight decay leaves a zero B at zero), and a version 2 equal
to version 1 would make the skipped update undetectable by any alarm."""

import torch

from areal import Float, Graph, Json, node
from areal.nodes import compute_logprob, generate, ppo_update
from areal.nodes.workers.generate import GenerateNode
from tests.runtime.tiny_rl import Prompts, advantage, config  # noqa: F401 (config: the recipe's config)

SKIPPED = 2
_load = GenerateNode.load_weights


def _skip_one(self, weights, version):
    if version == SKIPPED:
        self.engine.version = version  # says it holds version 2, holds version 1
        return
    _load(self, weights, version)


GenerateNode.load_weights = _skip_one


@node(inputs={"completion": Json["S"]}, outputs={"reward": Float["S"]})
def vowels_untied(batch):
    share = [sum(c in "aeiou" for c in t) / max(len(t), 1) for t in batch["completion"]]
    return {"reward": torch.tensor(share) + 0.01 * torch.arange(len(share))}


g = Graph("tiny-rl-skip-update")
g.source("tasks", Prompts())
g.add(generate("rollout"))
g.add(vowels_untied)
g.add(advantage)
g.add(compute_logprob("proximal"))
g.add(ppo_update("actor"))

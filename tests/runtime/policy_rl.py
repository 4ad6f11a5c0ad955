"""recipes/emulated_rl.py with a recording advantage: each sample's token versions as they reach the trainer.

The advantage node appends (sample id, the version of each output token, whether the output was cut at
max_new_tokens) to `arrived.jsonl` in the run directory, so a test checks a staleness policy's guarantee on
what the generators stamped, independently of the trainer's own check and of any timing.
"""

import json
from pathlib import Path

from areal import Float, Graph, Int, Int32, RunConfig, node
from areal.data import math_tasks
from areal.graph.node import NodeSpec
from areal.kernels.advantage import leave_one_out
from areal.nodes import compute_logprob, generate, ppo_update, reward
from areal.rewards import math_reward

config = RunConfig(
    batch_size=2,
    group_size=4,
    staleness=1,
    steps=10,
    generation={"engine": "emulated", "max_new_tokens": 256, "max_batch": 32, "stop": []},
    trainer={"engine": "emulated"},
    emulation={"output_tokens_median": 48, "output_tokens_sigma": 1.0, "time_scale": 0.05},
    checkpoint={"interval_steps": 0},
)


@node(inputs={"reward": Float["S"], "group_id": Int["S"], "versions": Int32["S", "T"], "truncated": Int["S"]},
      outputs={"advantage": Float["S"]})
class RecordedAdvantage:
    def setup(self, context):
        self.log = Path(context.run_dir) / "arrived.jsonl"

    def __call__(self, batch):
        with self.log.open("a") as out:
            for sid, versions, cut in zip(batch["sample_id"].tolist(), batch["versions"].rows(),
                                          batch["truncated"].tolist()):
                out.write(json.dumps({"sample_id": sid, "versions": versions.tolist(), "truncated": cut}) + "\n")
        return {"advantage": leave_one_out(batch["reward"], batch["group_id"])}


def policy_graph(trainer: NodeSpec | None = None) -> Graph:
    """The graph, with `trainer` in place of the proximal pass and ppo_update when given (own_trainer_rl.py)."""
    graph = Graph("policy-rl")
    graph.source("tasks", math_tasks("train"))
    graph.add(generate("rollout"), pool=1)
    graph.add(reward("score", math_reward(timeout_s=2.0)), pool=1)
    graph.add(RecordedAdvantage)
    if trainer is not None:
        graph.add(trainer, name="actor")
        return graph
    graph.add(compute_logprob("proximal"))
    graph.add(ppo_update("actor"))
    return graph


g = policy_graph()

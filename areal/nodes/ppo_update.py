"""The `ppo-update` node kind: consume B groups, step the optimizer, publish version + 1.

Its new weights travel on a control edge to every generate / compute-logprob node of its model,
so the data graph stays acyclic.
"""

from __future__ import annotations

from typing import Any

from areal.graph.node import NodeSpec
from areal.nodes import ports


def ppo_update(name: str, *, clip_eps: float | None = None, objective: str | None = None) -> NodeSpec:
    """Train the policy named `name` with (decoupled) PPO; arguments override RunConfig.trainer."""
    return NodeSpec(
        "ppo-update",
        name,
        inputs={
            "prompt_ids": ports.PROMPT_IDS,
            "output_ids": ports.OUTPUT_IDS,
            "behav_logp": ports.BEHAV_LOGP,
            "prox_logp": ports.PROX_LOGP,
            "versions": ports.VERSIONS,
            "advantage": ports.ADVANTAGE,
        },
        outputs={},
        factory=_factory,
        params={"clip_eps": clip_eps, "objective": objective},
        doc="decoupled PPO over batches of B groups; publishes weights as version + 1",
    )


def _factory(**params: Any) -> Any:
    from areal.nodes.trainer_worker import TrainerNode

    return TrainerNode(**params)

"""The `compute-logprob` node kind: log π_prox with the trainer's current weights.

The compiler colocates it with the ppo-update that owns its model, so it runs one forward
pass over the whole batch just before the update's first minibatch (DESIGN.md section 5).
With the `standard` objective no proximal pass is needed and it passes π_behav through.
"""

from __future__ import annotations

from typing import Any

from areal.graph.node import NodeSpec
from areal.nodes import ports


def compute_logprob(name: str, *, model: str | None = None) -> NodeSpec:
    return NodeSpec(
        "compute-logprob",
        name,
        inputs={"prompt_ids": ports.PROMPT_IDS, "output_ids": ports.OUTPUT_IDS, "behav_logp": ports.BEHAV_LOGP},
        outputs={"prox_logp": ports.PROX_LOGP},
        factory=_factory,
        params={"model": model},
        doc="log π_prox of each output token under the trainer's current weights",
    )


def _factory(**params: Any) -> Any:
    from areal.nodes.trainer_worker import ProximalNode

    return ProximalNode(**params)

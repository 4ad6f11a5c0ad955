"""The `compute-logprob` node kind: log π_prox with the trainer's current weights.

The compiler colocates it with the ppo-update that owns its model, so it runs one forward
pass over the whole batch just before the update's first minibatch (DESIGN.md section 5).
With the `standard` objective no proximal pass is needed and it passes π_behav through.
"""

from __future__ import annotations

from typing import Any

from areal.errors import ConfigError
from areal.graph.node import NodeSpec
from areal.nodes import ports


def compute_logprob(name: str, *, model: str | None = None, frozen: bool | str = False,
                    output: str = "prox_logp") -> NodeSpec:
    """log-probs of each output token under a model.

    `model` names the trainer whose current weights to use (default: the only one): the node then
    runs in that trainer's process, just before its update (π_prox). `frozen=True` uses the run's
    starting model as it is, never updated (a KL reference), or `frozen="/path/to/checkpoint"`
    another one; it is loaded once, in a pool of its own. `output` names the port (`ref_logp`).
    """
    if frozen and model:
        raise ConfigError(f"compute_logprob({name!r}): model={model!r} follows a trainer's weights, frozen= "
                          "keeps a model fixed; give one of them")
    return NodeSpec(
        "compute-logprob",
        name,
        inputs={"prompt_ids": ports.PROMPT_IDS, "output_ids": ports.OUTPUT_IDS, "behav_logp": ports.BEHAV_LOGP},
        outputs={output: ports.PROX_LOGP},
        factory=_factory,
        params={"model": model, "frozen": frozen, "output": output},
        doc="log-probs of each output token under " + ("a frozen model" if frozen else "the trainer's current weights"),
    )


def _factory(**params: Any) -> Any:
    from areal.nodes.workers.trainer import ProximalNode

    return ProximalNode(**params)

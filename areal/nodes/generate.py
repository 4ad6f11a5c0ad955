"""The `generate` node kind: a policy copy that samples G completions per prompt.

It is a streaming node: the worker submits prompts as they arrive, steps the engine one decode
step at a time, and hands it new weights between steps (interruptible generation), so a long
sequence continues on the newest policy. Each output token records the version that sampled it.
"""

from __future__ import annotations

from typing import Any

from areal.graph.node import NodeSpec
from areal.nodes import ports


def generate(name: str, *, group_size: int | None = None, model: str | None = None) -> NodeSpec:
    """Sample `group_size` completions per prompt (default: RunConfig.group_size).

    `model` names the ppo-update node whose weights this policy follows (default: the only one).
    """
    return NodeSpec(
        "generate",
        name,
        inputs={"prompt": ports.PROMPT},
        outputs={
            "prompt_ids": ports.PROMPT_IDS,
            "output_ids": ports.OUTPUT_IDS,
            "behav_logp": ports.BEHAV_LOGP,
            "versions": ports.VERSIONS,
            "completion": ports.COMPLETION,
        },
        factory=_factory,
        params={"group_size": group_size, "model": model},
        doc="samples G completions per prompt; follows the trainer's weights between decode steps",
    )


def _factory(**params: Any) -> Any:
    from areal.nodes.generate_worker import GenerateNode

    return GenerateNode(**params)

"""The `reward` node kind: score completions with a reward function, on a CPU pool.

A reward function takes the batch's text fields and returns one outcome per sample (a float,
or an object with `reward` and `reason`). An outcome with a reason other than a plain wrong
answer that comes from the reward machinery (`sandbox_error`), a NaN, or a raised exception
makes the sample *failed*: counted and reported with its sample_id, never a silent 0.0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from areal.graph.node import NodeSpec
from areal.graph.ports import PortType
from areal.nodes import ports

CODE_INPUTS: dict[str, PortType] = {"prompt": ports.PROMPT, "completion": ports.COMPLETION, "tests": ports.TESTS}


def reward(name: str, fn: Any, *, inputs: Mapping[str, PortType] | None = None) -> NodeSpec:
    """Score each sample with `fn(prompts, completions, tests) -> list[outcome]`.

    `inputs` defaults to `fn.inputs` when the function declares them, else prompt/completion/tests.
    """
    declared = dict(inputs or getattr(fn, "inputs", None) or CODE_INPUTS)
    return NodeSpec(
        "reward",
        name,
        inputs=declared,
        outputs={"reward": ports.REWARD},
        factory=_factory(fn),
        params={"fn": getattr(fn, "__name__", type(fn).__name__)},
        doc=f"scores with {getattr(fn, '__name__', type(fn).__name__)}",
    )


def _factory(fn: Any) -> Any:
    def build(**_: Any) -> Any:
        from areal.nodes.reward_worker import RewardNode

        return RewardNode(fn)

    return build

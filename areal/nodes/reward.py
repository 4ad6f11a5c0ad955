"""The `reward` node kind: score completions with a reward function, on a CPU pool.

A reward function takes the batch's fields and returns one outcome per sample (a float, or an
object with `reward` and `reason`). A function that names its fields, in `input_names` (the math
reward: completion, answer) or as its required parameters (`def judge(completion, answer)`), gets
exactly those, in that order, and the node declares them as its input ports, so the graph checks
that something upstream produces them; one that names none, or asks for `(programs, tests)`, is a
code reward and gets programs and tests: the prompt followed by the completion where the two read
as one Python program (a header and its body), else the completion alone (a fenced reply, an answer
to a problem in words). An outcome with a reason other than a plain wrong answer that comes from
the reward machinery (`sandbox_error`), a NaN, or a raised exception makes the sample *failed*:
counted and reported with its sample_id, never a silent 0.0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from areal.graph.node import IMPLICIT_INPUTS, NodeSpec
from areal.graph.ports import Json, PortType
from areal.nodes import ports
from areal.nodes.workers.reward import RewardNode, field_names

CODE_INPUTS: dict[str, PortType] = {"prompt": ports.PROMPT, "completion": ports.COMPLETION, "tests": ports.TESTS}
# the port type of a field a reward function names in `input_names`; any other name is json per sample
KNOWN_INPUTS: dict[str, PortType] = {**CODE_INPUTS, "answer": ports.ANSWER, **IMPLICIT_INPUTS}


def reward(name: str, fn: Any, *, inputs: Mapping[str, PortType] | None = None) -> NodeSpec:
    """Score each sample with `fn(*(batch[n] for n in names))`, `names` being `fn.input_names`, else its required
    parameters (`def judge(completion, answer)`); a code reward, `fn(programs, tests)`.

    Input ports: `inputs`, else `fn.inputs`, else one port per name, else prompt/completion/tests.
    """
    declared = dict(inputs or getattr(fn, "inputs", None) or _named_inputs(fn) or CODE_INPUTS)
    return NodeSpec(
        "reward",
        name,
        inputs=declared,
        outputs={"reward": ports.REWARD},
        factory=_factory(fn),
        params={"fn": getattr(fn, "__name__", type(fn).__name__)},
        doc=f"scores with {getattr(fn, '__name__', type(fn).__name__)}",
        preflight=getattr(fn, "preflight", None),
    )


def _named_inputs(fn: Any) -> dict[str, PortType]:
    return {n: KNOWN_INPUTS.get(n, Json["S"]) for n in field_names(fn)}


def _factory(fn: Any) -> Any:
    def build(**_: Any) -> Any:
        return RewardNode(fn)

    return build

"""The `generate` node kind: a policy copy that samples G completions per prompt.

It is a streaming node: the worker submits prompts as they arrive, steps the engine one decode
step at a time, and hands it new weights between steps (interruptible generation), so a long
sequence continues on the newest policy. Each output token records the version that sampled it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, PositiveInt

from areal.config import GenerationConfig
from areal.graph.node import NodeSpec
from areal.nodes import ports
from areal.nodes.settings import checked_settings


def generate(name: str, *, model: str | None = None, **settings: Any) -> NodeSpec:
    """Sample G completions per prompt with the policy `model` names (default: the only ppo-update node).

    Keyword arguments set how samples are drawn: `group_size` (G) and any field of
    RunConfig.generation (`max_new_tokens=64`, `temperature=0.8`). They bind the whole run,
    since the trainer and the accounting must agree with them; `--set nodes.NAME.FIELD=...` wins
    over them (areal/graph/settings.py).
    """
    sampling = {k: v for k, v in settings.items() if k != "group_size"}
    label = f"generate({name!r})"
    checked = checked_settings(GenerationConfig, sampling, label)
    if "group_size" in settings:
        checked |= checked_settings(_GroupSize, {"group_size": settings["group_size"]}, label)
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
            "truncated": ports.TRUNCATED,
        },
        factory=_factory,
        params={"model": model},
        doc="samples G completions per prompt; follows the trainer's weights between decode steps",
        settings=checked,
        setting_paths={"group_size": "group_size", **{f: f"generation.{f}" for f in GenerationConfig.model_fields}},
        settings_scope="run",
    )


class _GroupSize(BaseModel):
    group_size: PositiveInt


def _factory(**params: Any) -> Any:
    from areal.nodes.workers.generate import GenerateNode

    return GenerateNode(**params)

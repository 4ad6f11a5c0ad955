"""The `episode` node kind: an agent that talks to the policy for several turns, with tools in between.

The researcher writes `async def run(task, llm)` (or a class with `setup(context)` and an async
`run`): it awaits `llm.generate(text)` or `llm.chat(messages)` as often as it likes, runs tools
between turns, and returns the reward or a dict (`reward` and the node's declared `outputs`). An
agent written against the OpenAI API points its client at `llm.base_url` with `llm.api_key`
(`endpoint=True`) and may post its reward instead of returning it. The runtime assembles one
trajectory per episode (nodes/episodes/trajectory.py): every token, a loss mask (model tokens 1, tool and
environment tokens 0), behaviour log-probs and versions per token; the trainer masks the loss with it.

It samples the policy like `generate` does: its own pool, new weights between decode steps (a turn
in flight continues on them), G episodes per task (`group_size`), the staleness bound per episode
(every token of an episode is sampled at a version at least its group's admission version, and the
trainer re-checks the oldest), and exactly-once per episode across a killed worker (its groups are
re-issued and their episodes re-run from the start; the trainer drops duplicates by sample id).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from areal.config import GenerationConfig
from areal.errors import ConfigError
from areal.graph.node import NodeSpec, caller_location
from areal.graph.ports import PortType
from areal.nodes import ports
from areal.nodes.generate import _GroupSize
from areal.nodes.settings import checked_settings

OUTPUTS: dict[str, PortType] = {
    "prompt_ids": ports.PROMPT_IDS,
    "output_ids": ports.OUTPUT_IDS,
    "loss_mask": ports.LOSS_MASK,
    "behav_logp": ports.BEHAV_LOGP,
    "versions": ports.VERSIONS,
    "reward": ports.REWARD,
    "turns": ports.TURNS,
    "transcript": ports.TRANSCRIPT,
}


def episode(name: str, run: Any, *, inputs: Mapping[str, PortType] | None = None,
            outputs: Mapping[str, PortType] | None = None, model: str | None = None, endpoint: bool = False,
            timeout_s: float | None = 600.0, **settings: Any) -> NodeSpec:
    """Run `run(task, llm)` once per sample; `task` holds the sample's `inputs` (default: prompt).

    `outputs` declares what `run` returns besides `reward` (a float, or a list per token). `endpoint=True`
    serves the OpenAI-compatible endpoint in the worker (the `agent` extra). `timeout_s` fails an episode
    that runs longer. Keyword settings are `group_size` and any field of RunConfig.generation, bound for the
    whole run like generate's (`max_new_tokens` is per turn).
    """
    label = f"episode({name!r})"
    where = caller_location()
    prefix = f"{where}: {label}" if where else label
    extra = dict(outputs or {})
    clash = sorted(set(extra) & set(OUTPUTS))
    if clash:
        raise ConfigError(f"{prefix}: outputs {', '.join(map(repr, clash))} are the runtime's own (an episode always "
                          f"outputs {', '.join(OUTPUTS)}); name yours otherwise")
    if timeout_s is not None and not timeout_s > 0:
        raise ConfigError(f"{prefix}: timeout_s must be > 0 seconds (or None for no limit), got {timeout_s}")
    sampling = {k: v for k, v in settings.items() if k != "group_size"}
    checked = checked_settings(GenerationConfig, sampling, label)
    if "group_size" in settings:
        checked |= checked_settings(_GroupSize, {"group_size": settings["group_size"]}, label)
    target_name = getattr(run, "__name__", type(run).__name__)
    return NodeSpec(
        "episode",
        name,
        inputs=dict(inputs or {"prompt": ports.PROMPT}),
        outputs={**OUTPUTS, **extra},
        factory=_factory(run, extra),
        params={"model": model, "run": target_name, "endpoint": endpoint, "timeout_s": timeout_s},
        doc=f"runs {target_name}(task, llm) per sample: multi-turn episodes over the policy",
        settings=checked,
        setting_paths={"group_size": "group_size", **{f: f"generation.{f}" for f in GenerationConfig.model_fields}},
        settings_scope="run",
        implementation=run,
    )


def _factory(run: Any, outputs: dict[str, PortType]) -> Any:
    def build(model: str | None = None, endpoint: bool = False, timeout_s: float | None = None, **_: Any) -> Any:
        from areal.nodes.episodes.worker import EpisodeRunner

        return EpisodeRunner(run, outputs, model=model, endpoint=endpoint, timeout_s=timeout_s)

    return build

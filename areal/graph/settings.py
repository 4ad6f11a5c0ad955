"""A node's settings: one place to set each, one documented precedence, checked once.

A built-in node takes some RunConfig fields as keyword arguments (`ppo_update("actor",
objective="standard")` sets `trainer.objective` for that node). What a node sees, weakest first:
the recipe's RunConfig section, the node's own arguments, then `--set nodes.NAME.KEYWORD=...`.
A `--set` of the section field itself (`--set trainer.objective=...`) for a field the node sets
in the recipe is refused with a message that names the node's line and the override that works:
it would otherwise silently lose. Settings with "run" scope (a generator's group size and
sampling, which the trainer and the accounting must agree on) are applied to the run's config. A run that sets
no `generation.stop` gets its training tasks' own (`task_stops`).
"""

from __future__ import annotations

from typing import Any

from areal.config import RunConfig
from areal.errors import ConfigError
from areal.graph.graph import Graph
from areal.graph.node import Node
from areal.overrides import override_keys, with_values


def resolve_run_config(graph: Graph, config: RunConfig, overrides: tuple[str, ...] | list[str]) -> RunConfig:
    """The run's config once every node's settings are placed; raises ConfigError naming node and line."""
    problems = _refused_overrides(graph, config, overrides)
    problems += [f"--set nodes.{name}...: there is no node '{name}' (nodes: {', '.join(graph.nodes)})"
                 for name in config.nodes if name not in graph.nodes]
    run_values: dict[str, tuple[Any, Node]] = {}
    for n in graph.nodes.values():
        try:
            values = node_values(n, config)
        except ConfigError as err:
            problems.append(str(err))
            continue
        if n.spec.settings_scope != "run":
            continue
        for path, value in values.items():
            other = run_values.get(path)
            if other is not None and other[0] != value:
                problems.append(f"{n.describe()}: sets {path}={value!r} but {other[1].describe()} sets "
                                f"{other[0]!r}; the run has one {path}")
            run_values[path] = (value, n)
    if problems:
        raise ConfigError("\n".join(problems))
    setters: dict[str, list[str]] = {}
    for path, (value, n) in run_values.items():
        setters.setdefault(n.describe(), []).append(f"{path}={value!r}")
    origin = "; ".join(f"{who} sets {', '.join(values)}" for who, values in setters.items())
    resolved = with_values(config, {p: v for p, (v, _) in run_values.items()}, origin)
    if resolved.generation.stop is None:  # the training tasks' own (the built-in code tasks': a body's end)
        sources = [n.spec.instantiate() for n in graph.nodes.values() if n.kind == "source"]
        stops = list(dict.fromkeys(s for source in sources for s in task_stops(source, resolved)))
        resolved = with_values(resolved, {"generation.tasks_stop": stops}, "the training tasks' stop strings")
    for n in graph.nodes.values():
        seen = node_config(resolved, n)  # each node's view must validate too (a trainer's lr, its ranks and engine)
        trains = "trainer.microbatch_tokens" in n.spec.setting_paths.values()
        too_small = seen.microbatch_too_small() if trains else None
        if too_small:
            problems.append(f"{n.describe()}: {too_small}")
    if problems:
        raise ConfigError("\n".join(problems))
    return resolved


def task_stops(source: Any, config: RunConfig) -> tuple[str, ...]:
    """The strings a task source's completions end at, for a run that sets no generation.stop: a config-chosen
    source's `stop_strings(config)` (`code_tasks`), a source's `stop` strings (the built-in sets), else none (a
    source of one's own whose `stop` is something else, a method that ends a reader, has none)."""
    chosen = getattr(source, "stop_strings", None)
    stops = chosen(config) if callable(chosen) else getattr(source, "stop", ())
    return tuple(stops) if isinstance(stops, (list, tuple)) and all(isinstance(s, str) for s in stops) else ()


def node_config(config: RunConfig, n: Node) -> RunConfig:
    """The config node `n` runs with: the run's, with its own settings on top."""
    values = node_values(n, config)
    if not values or n.spec.settings_scope == "run":
        return config  # run-scoped settings are in the run's config already
    return with_values(config, values, n.describe())


def node_values(n: Node, config: RunConfig) -> dict[str, Any]:
    """Dotted RunConfig path -> value for every setting of `n`: its arguments, then `--set nodes.NAME.*`."""
    given = {**n.spec.settings, **config.nodes.get(n.name, {})}
    unknown = sorted(set(given) - set(n.spec.setting_paths))
    if unknown:
        takes = ", ".join(n.spec.setting_paths) or "none"
        raise ConfigError(f"{n.describe()}: unknown setting {', '.join(map(repr, unknown))} (it takes: {takes})")
    return {n.spec.setting_paths[k]: v for k, v in given.items()}


def _refused_overrides(graph: Graph, config: RunConfig, overrides: tuple[str, ...] | list[str]) -> list[str]:
    typed = override_keys(overrides)
    problems = []
    for n in graph.nodes.values():
        for keyword in n.spec.settings:
            path = n.spec.setting_paths.get(keyword)
            # a field inside a section the node sets whole (--set trainer.lora.rank=8 under ppo_update(lora=...))
            inside = [key for key in typed if path is not None and key.startswith(path + ".")]
            for key in ([path] if path in typed else []) + inside:
                problems.append(
                    f"{typed[key]}: {n.describe()} sets {keyword}={n.spec.settings[keyword]!r} itself, which wins "
                    f"over {key}; change it there, or use --set nodes.{n.name}.{keyword}=..."
                )
    return problems

"""Nodes: the typed steps of a graph.

A `NodeSpec` is what a recipe builds (a decorated function, a stateful class, or a built-in
kind such as `generate`); `Graph.add` binds it under a name and records the recipe line that
declared it, so every later error can point there. The graph never runs a node: workers
load the recipe again and call `NodeSpec.instantiate()`, so no code object crosses a socket.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from areal.graph.batch import Batch, Field
from areal.graph.ports import Int, PortType
from areal.graph.roles import ROLES, role_of

KINDS = ("source", "generate", "episode", "reward", "compute-logprob", "ppo-update", "custom")
POLICY_KINDS = ("generate", "episode", "compute-logprob")  # kinds that use a trained model's weights by default

# Ports a node kind cannot work without: (inputs, outputs). The runtime relies on these names.
REQUIRED_PORTS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "generate": (frozenset({"prompt"}), frozenset({"prompt_ids", "output_ids", "behav_logp", "versions"})),
    "episode": (frozenset(), frozenset({"prompt_ids", "output_ids", "loss_mask", "behav_logp", "versions", "reward"})),
    "reward": (frozenset(), frozenset({"reward"})),
    "compute-logprob": (frozenset({"prompt_ids", "output_ids"}), frozenset()),
    "ppo-update": (
        frozenset({"prompt_ids", "output_ids", "behav_logp", "versions", "advantage"}),
        frozenset(),
    ),
}


# Fields the runtime attaches to every sample: any node may read them without a producer.
IMPLICIT_INPUTS: dict[str, PortType] = {"sample_id": Int["S"], "group_id": Int["S"]}

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Location:
    """Where a recipe declared something: printed as `file:line`."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{_display_path(self.file)}:{self.line}"


def _display_path(path: str) -> str:
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else path


def caller_location() -> Location | None:
    """The innermost stack frame outside the areal package: the recipe line that called us."""
    for frame_info in inspect.stack(context=0)[1:]:
        path = os.path.abspath(frame_info.filename)
        if not path.startswith(_PACKAGE_DIR + os.sep):
            return Location(path, frame_info.lineno)
    return None


@runtime_checkable
class StatefulNode(Protocol):
    """A node that keeps state across batches (a model, a sandbox pool).

    `setup(context)` runs once in the worker before the first batch (`context`: roles.NodeContext);
    `__call__` runs per batch and returns the node's output fields.
    """

    def setup(self, context: Any) -> None: ...

    def __call__(self, batch: Batch) -> Mapping[str, Field]: ...


@dataclass(frozen=True)
class NodeSpec:
    """A node before it is placed in a graph: its kind, ports and how to build its implementation.

    `factory(**params)` returns the callable a worker runs per batch (a function, or an object
    with `setup`/`__call__`). `params` must be plain values so that the plan can print them.
    `preflight()`, when given, checks this machine can run the node (a sandbox, a GPU); `areal
    run` calls it once before any worker starts, so a missing capability fails in seconds, and
    prints what it returns (how the node is protected or placed), once.

    `setting_paths` are the keyword arguments that set a RunConfig field for this node (`lr` ->
    `trainer.lr`) and `settings` the ones the recipe gave; `graph/settings.py` resolves them.
    `settings_scope` says whom they bind: "node" (this node's view of the config, a trainer's
    lr) or "run" (the whole run, for what every node must agree on: how samples were drawn).
    """

    kind: str
    name: str
    inputs: Mapping[str, PortType]
    outputs: Mapping[str, PortType]
    factory: Callable[..., Any]
    params: Mapping[str, Any] = field(default_factory=dict)
    doc: str = ""
    preflight: Callable[[], str | None] | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    setting_paths: Mapping[str, str] = field(default_factory=dict)
    settings_scope: str = "node"
    role: str = ""  # map, filter, stream or trainer (graph/roles.py); "" takes the kind's
    implementation: Any = None  # the class or function a custom node was declared from (checked against its role)
    # input ports bound only when some node produces them (a trainer's loss_mask: episodes produce one,
    # single-turn generation has none); when produced, they are checked like any other input
    optional: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"node {self.name!r}: unknown kind {self.kind!r} (known: {', '.join(KINDS)})")
        if self.role and self.role not in ROLES:
            raise ValueError(f"node {self.name!r}: unknown role {self.role!r} (known: {', '.join(ROLES[1:])})")
        object.__setattr__(self, "role", role_of(self.kind, self.role or None))
        for ports in (self.inputs, self.outputs):
            for port, ptype in ports.items():
                if not isinstance(ptype, PortType):
                    raise TypeError(
                        f"node {self.name!r}: port {port!r} needs a type like Float['S'], got {ptype!r}"
                    )

    def instantiate(self) -> Any:
        return self.factory(**self.params)

    def with_params(self, **params: Any) -> NodeSpec:
        return replace(self, params={**self.params, **params})


@dataclass(frozen=True)
class Node:
    """A node placed in a graph under a unique name."""

    spec: NodeSpec
    name: str
    pool: int | None  # replicas asked for by the recipe; None lets the compiler decide
    where: Location | None
    take: Mapping[str, str] = field(default_factory=dict)  # input port -> "producer" or "producer.port"

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def role(self) -> str:
        return self.spec.role

    @property
    def inputs(self) -> Mapping[str, PortType]:
        return self.spec.inputs

    @property
    def outputs(self) -> Mapping[str, PortType]:
        return self.spec.outputs

    def describe(self) -> str:
        """`recipes/x.py:14: node 'score' (reward)` — the prefix of every error about this node."""
        prefix = f"{self.where}: " if self.where else ""
        return f"{prefix}node '{self.name}' ({self.kind})"


def node(
    inputs: Mapping[str, PortType],
    outputs: Mapping[str, PortType],
    *,
    kind: str = "custom",
    name: str | None = None,
    role: str | None = None,
    optional: Iterable[str] = (),
) -> Callable[[Any], NodeSpec]:
    """Declare a custom node from a function `f(batch) -> dict` or a stateful class.

    A class is instantiated once per worker (with no arguments), then `setup(context)` if it
    has one, then called per batch. `role` (map, filter, stream, trainer; graph/roles.py) says
    how the runtime drives it; by default its kind's (a custom node maps). `optional` names input
    ports the node takes only when some node produces them (a trainer's `loss_mask`).
    """
    unknown = set(optional) - set(inputs)
    if unknown:
        raise ValueError(f"@node: optional names {', '.join(sorted(unknown))}, which are not among its inputs")

    def wrap(target: Any) -> NodeSpec:
        label = name or target.__name__
        doc = inspect.getdoc(target) or ""
        if inspect.isclass(target):
            factory = target
        elif callable(target):
            factory = returns(target)
        else:
            raise TypeError(f"@node decorates a function or a class, not {type(target).__name__}")
        return NodeSpec(kind, label, dict(inputs), dict(outputs), factory, {}, doc.split("\n")[0], role=role or "",
                        implementation=target, optional=frozenset(optional))

    return wrap


def returns(obj: Any) -> Callable[[], Any]:
    """A factory that hands back `obj` itself (function nodes and sources are built by the recipe)."""

    def factory() -> Any:
        return obj

    return factory

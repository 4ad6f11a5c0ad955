"""What a node must implement to play its part in a run: its role's Protocol.

A node's role says how the runtime drives it. Built-in kinds have theirs (`generate` is a
stream, `ppo-update` a trainer, the rest maps); a custom node declares one with
`@node(..., role=...)`, and validation checks, at the recipe line, that it has the methods its
role needs, so a mistake is never found by a `hasattr` deep in a worker loop.

- map: `__call__(batch) -> fields`, once per batch (a group of samples, or a held-out round).
- filter: a map that may drop samples: it returns `{DROPPED: {row: reason}}` among its fields.
  Dropped samples are counted `filtered` (not failed) and a group dropped whole frees its
  staleness slot, so the source admits another. Held-out rounds pass a filter untouched.
- stream: a generator-like node the worker steps (`submit`, `step`, `pending`) and hands new
  weights between steps (`load_weights`): interruptible generation.
- trainer: `__call__(batch) -> stats` once per step of B groups; `empty_step()` for a step
  whose every sample failed or was filtered; `save_weights(path)` publishes the policy.

Any role may also have `setup(context)` (once per worker, before the first batch). A map node
that names a trained model (`model=`) outside its trainer's pool follows that model's weights
and needs `load_weights(path, version)` too.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Protocol

from areal.graph.batch import Batch
from areal.graph.meta import GroupMeta

ROLES = ("source", "map", "filter", "stream", "trainer")
KIND_ROLES = {"source": "source", "generate": "stream", "ppo-update": "trainer"}  # every other kind maps

# keys a node may return among its fields (row index -> reason, or name -> number)
FAILED = "__failed__"  # samples whose value could not be computed: counted failed, never trained
DROPPED = "__dropped__"  # a filter's drops: counted filtered
METRICS = "__metrics__"  # numbers about this batch, averaged into the step's metrics


class MapNode(Protocol):
    def __call__(self, batch: Batch) -> Mapping[str, Any]: ...


class StreamNode(Protocol):
    def submit(self, batch: Batch, meta: GroupMeta) -> None: ...
    def step(self) -> list[tuple[Batch, GroupMeta]]: ...
    def pending(self) -> int: ...
    def load_weights(self, path: str | None, version: int) -> None: ...


class TrainerNode(Protocol):
    def __call__(self, batch: Batch) -> Mapping[str, float]: ...
    def empty_step(self) -> None: ...
    def save_weights(self, path: str | None) -> None: ...


PROTOCOLS: dict[str, type] = {"map": MapNode, "filter": MapNode, "stream": StreamNode, "trainer": TrainerNode}


def role_of(kind: str, declared: str | None) -> str:
    """The role of a node of `kind`, or the one it declared (a custom node)."""
    return declared or KIND_ROLES.get(kind, "map")


def missing_methods(role: str, target: Any, follows_weights: bool = False) -> list[str]:
    """The methods `target` (a class, or a function for map/filter) lacks for `role`."""
    protocol = PROTOCOLS.get(role)
    if protocol is None:
        return []
    needed = [name for name, member in vars(protocol).items()  # the methods the Protocol itself declares
              if inspect.isfunction(member) and member.__qualname__.startswith(f"{protocol.__name__}.")
              and (name == "__call__" or not name.startswith("__"))]
    if follows_weights and "load_weights" not in needed:
        needed.append("load_weights")
    if inspect.isfunction(target):  # a function node is its own __call__
        return [] if needed == ["__call__"] else [n for n in needed if n != "__call__"]
    return [name for name in needed if not callable(getattr(target, name, None))]

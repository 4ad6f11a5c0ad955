"""areal: fully asynchronous RL for reasoning models, declared as a dataflow graph.

The names below load on first use (PEP 562), so `areal --help`, a usage error or `areal samples` answers in a
fraction of a second instead of importing torch first (4 s here); a recipe's `from areal import Graph` loads them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["Batch", "Bool", "Double", "Float", "Graph", "Int", "Int32", "Json", "Ragged", "RunConfig", "node"]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from areal.config import RunConfig
    from areal.graph import Batch, Bool, Double, Float, Graph, Int, Int32, Json, Ragged, node


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'areal' has no attribute {name!r}")
    value = getattr(importlib.import_module("areal.config" if name == "RunConfig" else "areal.graph"), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return [*__all__, "__version__"]

"""Ray, imported only when a plan needs it: by the compiler for this node's address, by the launcher for its
actors. Without it, one sentence says how to get it and how to run without it."""

from __future__ import annotations

import importlib
from typing import Any

MISSING_RAY = ("cluster.backend=\"ray\" needs the 'ray' package (pip install 'areal[cluster]'); "
               "cluster.backend=\"local\" runs without it.")


def import_ray() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise ImportError(MISSING_RAY) from None

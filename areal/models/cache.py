"""Where the models areal builds or converts are kept: a module of its own, so that resolving a path imports no
model code."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$AREAL_CACHE, else ~/.cache/areal: where models areal builds or converts are kept."""
    root = os.environ.get("AREAL_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "areal"

"""Checking a built-in node's keyword settings where the recipe declares them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from areal.errors import ConfigError
from areal.graph.node import caller_location


def checked_settings(section: type[BaseModel], settings: Mapping[str, Any], label: str) -> dict[str, Any]:
    """The settings a node was given, each a field of `section` with a valid value, or a ConfigError at the recipe line.

    Only the fields are checked here; rules across fields (ranks > 1 needs engine=fsdp) are checked once the
    node's whole config is known (areal/graph/settings.py).
    """
    where = caller_location()
    prefix = f"{where}: {label}" if where else label
    unknown = sorted(set(settings) - set(section.model_fields))
    if unknown:
        raise ConfigError(f"{prefix}: unknown setting {', '.join(map(repr, unknown))} "
                          f"(it takes: {', '.join(section.model_fields)})")
    try:
        section(**settings)
    except ValidationError as err:
        fields = [e for e in err.errors() if e["loc"]]  # rules across fields have no loc: checked later
        if fields:
            raise ConfigError("\n".join(f"{prefix}: {'.'.join(map(str, e['loc']))}: {e['msg'][:1].lower()}"
                                        f"{e['msg'][1:]}" for e in fields)) from None
    return dict(settings)

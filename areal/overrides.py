"""`--set a.b=value` overrides and recipe values applied to a RunConfig through its pydantic model, so a bad
override fails exactly like a bad recipe value, naming the field (and the `--set` it came from)."""

from __future__ import annotations

import difflib
import json
from typing import Any

from pydantic import BaseModel, ValidationError

import areal.config as sections
from areal.config import RunConfig
from areal.errors import ConfigError


def apply_overrides(config: RunConfig, overrides: list[str]) -> RunConfig:
    """Apply `a.b=value` strings; values parse as JSON when they can, else stay strings."""
    data = config.model_dump()
    for text in overrides:
        key, sep, raw = text.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {text}: expected KEY=VALUE, e.g. --set trainer.lr=3e-6")
        _assign(data, key.strip().split("."), _parse_value(raw), f"--set {text}: ", config)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(describe(err, overrides)) from None


def with_values(config: RunConfig, values: dict[str, Any], origin: str) -> RunConfig:
    """`config` with dotted paths set to values, validated like `--set`; each error starts with `origin`."""
    data = config.model_dump()
    for path, value in values.items():
        _assign(data, path.split("."), value, f"{origin}: ", config)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError("\n".join(f"{origin}: {line}" for line in describe(err, []).splitlines())) from None


def override_keys(overrides: list[str] | tuple[str, ...]) -> dict[str, str]:
    """The dotted key each `--set` override names -> the override as typed."""
    return {text.partition("=")[0].strip(): text for text in overrides}


def validate_config(data: dict[str, Any]) -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(describe(err, [])) from None


def _parse_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _assign(data: dict[str, Any], path: list[str], value: Any, prefix: str, config: RunConfig) -> None:
    node: Any = data
    model: Any = type(config)
    for depth, part in enumerate(path):
        fields = model.model_fields if model is not None else None
        if fields is not None and part not in fields:
            where = ".".join(path[:depth]) or "config"
            raise ConfigError(
                f"{prefix}{'.'.join(path[: depth + 1])}: unknown field ({where} has: {', '.join(fields)})"
            )
        if depth == len(path) - 1:
            node[part] = value
            return
        if fields is None or _is_mapping(fields[part].annotation):
            node.setdefault(part, {})  # a mapping of names (placement, nodes): its keys are the user's
        if not isinstance(node.get(part), dict):
            raise ConfigError(f"{prefix}{'.'.join(path[: depth + 1])} is a value, not a section")
        annotation = fields[part].annotation if fields is not None else None
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
        node = node[part]


def _is_mapping(annotation: Any) -> bool:
    return getattr(annotation, "__origin__", None) is dict


def describe(err: ValidationError, overrides: list[str] | None = None) -> str:
    """One line per problem: the field (and the --set that gave it), then pydantic's message; a rule across fields
    (no field of its own) is its own message, which names the fields; a field the section lacks, the one meant."""
    lines = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ") if e["type"] == "value_error" else e["msg"]
        if e["type"] == "extra_forbidden":
            msg = _unknown(err.title, e["loc"])
        origin = next((o for o in overrides or [] if o.split("=", 1)[0].strip() == field), None)
        prefix = f"--set {origin}: " if origin else ""
        lines.append(f"{prefix}{field}: {msg[:1].lower()}{msg[1:]}" if field else msg)
    return "\n".join(lines)


def _unknown(title: str, loc: tuple[Any, ...]) -> str:
    """A field the section does not have: the one meant, when one is close, else the section's fields."""
    model: Any = getattr(sections, title, None)
    for part in loc[:-1]:  # down to the section the field was given in
        annotation = model.model_fields[part].annotation if model is not None and part in model.model_fields else None
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    if model is None:
        return "unknown field"
    near = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1)
    return f"unknown field; did you mean {near[0]}?" if near else \
        f"unknown field ({model.__name__} has: {', '.join(model.model_fields)})"

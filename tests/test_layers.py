"""Imports point down DESIGN.md's layer table: read every module's imports with ast."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "areal"

# layer -> the areal layers it may import (areal.config, its overrides and areal.errors are leaves anyone may use)
ALLOWED = {
    "graph": {"graph"},
    "kernels": {"kernels"},
    "models": {"models", "data"},  # the warm start learns from the built-in tasks
    "data": {"data"},
    "rewards": {"rewards"},
    "engines": {"engines", "kernels", "models"},
    "nodes": {"nodes", "graph", "engines", "kernels", "models", "rewards", "data"},
    "runtime": {"runtime", "graph", "kernels", "nodes", "engines", "models", "rewards", "data"},
    "view": {"view", "runtime", "graph"},  # reads what a run writes; nothing below imports it
}
LEAVES = {"config", "overrides", "errors"}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def test_layers_only_import_downwards():
    wrong = []
    for layer, allowed in ALLOWED.items():
        for path in sorted((ROOT / layer).rglob("*.py")):
            for line, module in _imports(path):
                parts = module.split(".")
                if parts[0] != "areal" or len(parts) < 2:
                    continue
                if parts[1] not in allowed | LEAVES:
                    wrong.append(f"{path.relative_to(ROOT.parent)}:{line} imports {module}")
    assert wrong == []


def test_leaf_modules_import_no_other_layer():
    for leaf in LEAVES:
        mods = [m for _, m in _imports(ROOT / f"{leaf}.py") if m.startswith("areal.")]
        assert all(m.split(".")[1] in LEAVES for m in mods), (leaf, mods)


def test_kernels_need_only_torch():
    third_party = set()
    for path in (ROOT / "kernels").rglob("*.py"):
        third_party |= {m.split(".")[0] for _, m in _imports(path)}
    assert third_party <= {"torch", "areal", "__future__", "dataclasses", "typing", "collections", "math",
                           "heapq", "itertools", "functools", "bisect"}, third_party

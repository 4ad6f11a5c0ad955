"""The layout keeps: imports point down the layers each package's docstring declares, no module imports
itself back through others, and no folder or module outgrows what a reader takes in.

A package is a layer when its `__init__` docstring has a paragraph "May import: areal.x, areal.y ...";
every module belongs to the deepest such package above it. A module may import its own layer, the
leaves (areal.config, areal.overrides, areal.errors), and any package its layer names with everything
inside it. Imports are read with `ast`, those inside functions and under TYPE_CHECKING included.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1] / "areal"
LEAVES = {"areal.config", "areal.overrides", "areal.errors"}
MAX_MODULES_PER_FOLDER = 15
MAX_MODULE_LINES = 400


def _module_names() -> dict[str, Path]:
    names = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        names[name.removesuffix(".__init__")] = path
    return names


MODULES = _module_names()


def _declared(package: str) -> set[str] | None:
    """The packages a layer's docstring says it may import, or None when the package is no layer of its own."""
    doc = ast.get_docstring(ast.parse(MODULES[package].read_text())) or ""
    found = re.search(r"^May import: (.*?)(?:\n\n|\Z)", doc, re.M | re.S)
    if found is None:
        return None
    named = found.group(1).split("(and the leaves")[0]
    return set(re.findall(r"areal(?:\.\w+)+", named)) - LEAVES


LAYERS = {name: declared for name, path in MODULES.items() if path.name == "__init__.py" and name != "areal"
          for declared in [_declared(name)] if declared is not None}


def _layer_of(module: str) -> str:
    parts = module.split(".")
    for end in range(len(parts), 1, -1):
        if ".".join(parts[:end]) in LAYERS:
            return ".".join(parts[:end])
    raise AssertionError(f"{module} lies in no layer")


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _is_leaf(module: str) -> bool:
    """A leaf, or a module inside a leaf package (areal.config.trainer)."""
    return any(_within(module, leaf) for leaf in LEAVES)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every areal module `path` imports, `from areal.x import y` naming y when it is one."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module)
                      for a in node.names]
    return [(line, module) for line, module in found if module.split(".")[0] == "areal"]


def test_every_top_level_package_declares_its_layer():
    top = {name for name, path in MODULES.items() if path.name == "__init__.py" and name.count(".") == 1}
    assert top - set(LAYERS) - LEAVES == set()


def test_modules_import_only_their_layer_and_what_it_declares():
    wrong = []
    for module, path in sorted(MODULES.items()):
        if module == "areal" or _is_leaf(module):
            continue
        layer = _layer_of(module)
        for line, target in _imports(path):
            allowed = _is_leaf(target) or target == "areal" or _layer_of(target) == layer or any(
                _within(target, package) for package in LAYERS[layer])
            if not allowed:
                wrong.append(f"{path.relative_to(ROOT.parent)}:{line} imports {target} ({layer} may import: "
                             f"{', '.join(sorted(LAYERS[layer])) or 'none'})")
    assert wrong == []


def test_a_layer_inside_another_declares_no_more_than_its_parent_may_reach():
    wrong = []
    for layer, declared in LAYERS.items():
        parent = ".".join(layer.split(".")[:-1])
        if parent == "areal":
            continue
        parent_layer = _layer_of(parent)
        for package in declared:
            if not (_within(package, parent_layer) or any(_within(package, p) for p in LAYERS[parent_layer])):
                wrong.append(f"{layer} declares {package}, which {parent_layer} may not import")
    assert wrong == []


def test_the_layers_form_no_circle():
    graph = nx.DiGraph([(layer, package) for layer, declared in LAYERS.items() for package in declared
                        if package in LAYERS])
    assert list(nx.simple_cycles(graph)) == []


def test_no_module_imports_itself_back_through_others():
    graph = nx.DiGraph()
    for module, path in MODULES.items():
        for _, target in _imports(path):
            while target not in MODULES:
                target = target.rsplit(".", 1)[0]
            if target != module:
                graph.add_edge(module, target)
    assert sorted(" -> ".join([*cycle, cycle[0]]) for cycle in nx.simple_cycles(graph)) == []


def test_no_folder_holds_more_than_15_modules_and_no_module_more_than_400_lines():
    crowded = {str(folder.relative_to(ROOT.parent)): count for folder in [ROOT, *ROOT.rglob("*/")]
               if folder.is_dir() and (count := len(list(folder.glob("*.py")))) > MAX_MODULES_PER_FOLDER}
    long = {str(path.relative_to(ROOT.parent)): lines for path in MODULES.values()
            if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert (crowded, long) == ({}, {})


def test_leaf_modules_import_no_other_layer():
    for leaf in filter(_is_leaf, MODULES):
        assert all(_is_leaf(target) for _, target in _imports(MODULES[leaf])), leaf


def test_kernels_need_only_torch():
    third_party = set()
    for path in (ROOT / "kernels").rglob("*.py"):
        tree = ast.parse(path.read_text())
        third_party |= {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                        for alias in node.names}
        third_party |= {node.module.split(".")[0] for node in ast.walk(tree)
                        if isinstance(node, ast.ImportFrom) and node.module}
    assert third_party <= {"torch", "areal", "__future__", "dataclasses", "typing", "collections", "math",
                           "heapq", "itertools", "functools", "bisect"}, third_party

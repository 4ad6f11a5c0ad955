"""areal runs on Python 3.10 (pyproject's requires-python): nothing it imports at run time is newer. Names only a
type checker reads may come from typing_extensions under `if TYPE_CHECKING:`."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what each standard module gained after 3.10, among what code like ours reaches for
NEWER = {"typing": {"Self", "Unpack", "Required", "NotRequired", "Never", "LiteralString", "assert_never",
                    "reveal_type", "TypeVarTuple", "dataclass_transform", "override", "TypeAliasType"},
         "itertools": {"batched"}, "contextlib": {"chdir"}, "enum": {"StrEnum", "verify"}, "datetime": {"UTC"}}
NEWER_MODULES = {"tomllib", "wsgiref.types"}


def run_time_imports(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, module, name) of every import not under `if TYPE_CHECKING:`."""
    checked = {id(n) for node in ast.walk(tree)
               if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if id(node) in checked:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, "") for alias in node.names]
    return found


def test_nothing_areal_imports_at_run_time_is_newer_than_python_3_10():
    newer = []
    for folder in ("areal", "benchmarks", "recipes"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, module, name in run_time_imports(ast.parse(path.read_text(), filename=str(path))):
                if module in NEWER_MODULES or name in NEWER.get(module, ()):
                    newer.append(f"{path.relative_to(ROOT)}:{line}: {module} {name}".rstrip())
    assert not newer, newer


def test_the_check_sees_a_newer_import_and_spares_one_a_type_checker_reads():
    tree = ast.parse("from typing import Any, Unpack\nimport tomllib\nif TYPE_CHECKING:\n    from typing import Self\n")
    assert run_time_imports(tree) == [(1, "typing", "Any"), (1, "typing", "Unpack"), (2, "tomllib", "")]

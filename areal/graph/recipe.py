"""Recipe loading: run a recipe file in isolation and take its Graph and RunConfig.

A recipe is a plain Python file; loading it executes it in a fresh namespace (never imported
as a module, so two recipes cannot see each other). Workers load the same file again to get
their node implementations, which is why a recipe has no side effects beyond declaring.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from areal.config import RunConfig
from areal.errors import ArealError, RecipeError
from areal.graph.graph import Graph
from areal.graph.settings import node_config, resolve_run_config
from areal.overrides import apply_overrides, describe


@dataclass(frozen=True)
class Recipe:
    path: Path
    graph: Graph
    config: RunConfig  # the run's, with every node's run-scoped settings in it
    overrides: tuple[str, ...] = ()

    def node_config(self, name: str) -> RunConfig:
        """The config node `name` runs with (its own settings on top of the run's)."""
        return node_config(self.config, self.graph.nodes[name])


def load_recipe(path: str | os.PathLike[str], overrides: list[str] | tuple[str, ...] = (),
                validate: bool = True) -> Recipe:
    """Execute the recipe, find exactly one Graph (and at most one RunConfig), apply overrides."""
    recipe = Path(path)
    if not recipe.is_file():
        raise RecipeError(f"{recipe}: no such recipe file")
    namespace = _execute(recipe)
    graphs = [v for v in namespace.values() if isinstance(v, Graph)]
    configs = [v for v in namespace.values() if isinstance(v, RunConfig)]
    if len(graphs) != 1:
        found = ", ".join(f"'{g.name}'" for g in graphs)
        raise RecipeError(
            f"{recipe}: a recipe declares exactly one Graph, found {len(graphs)}"
            + (f" ({found}); keep one per file" if graphs else "; add g = Graph('name') and its nodes")
        )
    if len(configs) > 1:
        raise RecipeError(f"{recipe}: a recipe declares at most one RunConfig, found {len(configs)}")
    config = apply_overrides(configs[0] if configs else RunConfig(), list(overrides))
    graph = graphs[0]
    if validate:
        graph.validate()
    config = resolve_run_config(graph, config, overrides)
    return Recipe(recipe.resolve(), graph, config, tuple(overrides))


def _execute(recipe: Path) -> dict[str, object]:
    _import_beside(recipe)
    try:
        return runpy.run_path(str(recipe), run_name="__areal_recipe__")
    except SyntaxError as err:  # in the recipe, or in a module of its own it imports
        where = Path(err.filename) if err.filename else recipe
        line = f":{err.lineno}" if err.lineno else ""
        imported = "" if _same_file(where, recipe) else f" (imported at {_recipe_line(recipe, err)})"
        raise RecipeError(f"{_shown(where)}{line}: syntax error: {err.msg}{imported}") from None
    except ArealError:
        raise
    except ValidationError as err:  # a config section built with a bad value or an unknown field: each named
        where = f"{_recipe_line(recipe, err)}: {err.title}"
        raise RecipeError("\n".join(f"{where}: {line}" for line in describe(err).splitlines())) from None
    except Exception as err:
        raise RecipeError(f"{_recipe_line(recipe, err)}: {type(err).__name__}: {err}{_raised_beside(recipe, err)}") \
            from err


def _import_beside(recipe: Path) -> None:
    """The recipe's folder first on sys.path, as `python recipe.py` puts it: a recipe imports the modules beside it
    (its own nodes, rewards, data), here and in every worker, for as long as the process runs (a node may import
    lazily)."""
    folder = str(recipe.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)


def _recipe_line(recipe: Path, err: Exception) -> str:
    """`recipe.py:LINE` of the deepest frame inside the recipe, where the error surfaced."""
    line = None
    for frame in traceback.extract_tb(err.__traceback__):
        if _same_file(frame.filename, recipe):
            line = frame.lineno
    return f"{_shown(recipe)}:{line}" if line else _shown(recipe)


def _raised_beside(recipe: Path, err: Exception) -> str:
    """Where in a module beside the recipe (the researcher's own) the error was raised, when not in the recipe."""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames or _same_file(Path(frames[-1].filename), recipe):
        return ""
    raised = Path(frames[-1].filename)
    beside = raised.resolve().is_relative_to(recipe.resolve().parent)
    return f" (raised at {_shown(raised)}:{frames[-1].lineno})" if beside else ""


def _same_file(a: Path | str, b: Path | str) -> bool:
    """Whether two paths name one file (a traceback's frames name it as it was run)."""
    return os.path.abspath(a) == os.path.abspath(b)


def _shown(recipe: Path) -> str:
    rel = os.path.relpath(recipe)
    return rel if not rel.startswith("..") else str(recipe)

"""What `areal viz --plan` says of the weights: each route with the way the configured transport moves them."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from areal.graph.recipe import load_recipe
from areal.runtime.compiler.compile import compile_plan
from areal.runtime.compiler.plan import Plan

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def _plan(tmp_path: Path, recipe: str, weights: str) -> Plan:
    loaded = load_recipe(RECIPES / recipe, [f"transport.weights={weights}"])
    return compile_plan(loaded.graph, loaded.config, run_dir=tmp_path / "run")


def _text(plan: Plan) -> str:
    console = Console(width=400, record=True, file=io.StringIO())  # wide: no route wraps
    console.print(plan.tree())
    console.print(plan.table())
    return console.export_text()


@pytest.mark.parametrize("weights, way", [
    ("files", "via {run}/weights"),
    ("broadcast", "by process-group broadcast (127.0.0.1:"),
    ("shm", "through a shared-memory segment per version, on the trainer's machine"),
])
def test_the_plan_names_the_transport_the_policys_weights_take_in_its_tree_and_its_table(tmp_path, weights, way):
    plan = _plan(tmp_path, "code_rl.py", weights)
    text = _text(plan)
    assert text.count(f"weights: actor ⇢ rollout {way.format(run=tmp_path / 'run')}") == 2
    assert Plan.from_json(plan.to_json()).weights_transport == weights  # plan.json keeps it


def test_a_critics_weights_travel_as_files_beside_a_policy_in_shared_memory(tmp_path):
    text = _text(_plan(tmp_path, "actor_critic.py", "shm"))
    assert (f"weights: actor ⇢ rollout through a shared-memory segment per version, on the trainer's machine; "
            f"critic ⇢ values via {tmp_path / 'run'}/weights") in text

"""Two Ray actors landing on one node without the run directory make its copy side by side: each writes the run's
inputs (the plan, the key, the recipe, the checkpoint it resumes from) into the same folder and reads the plan
back. Neither may ever read a file the other is part way through writing (a resumed trainer failed so)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import SimpleNamespace

from areal.graph.recipe import load_recipe
from areal.runtime.compiler.compile import compile_plan
from areal.runtime.compiler.plan import Plan
from areal.runtime.controller.ray_launcher import _into_copy

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def test_two_actors_copying_the_run_directory_on_one_node_each_read_whole_files(tmp_path, monkeypatch):
    loaded = load_recipe(RECIPES / "code_rl.py", [])
    home = tmp_path / "run"
    plan = compile_plan(loaded.graph, loaded.config, run_dir=home).to_json().encode()
    checkpoint = bytes(range(256)) * 8192  # 2 MiB: a long write, for the other actor to land in
    inputs = {"plan.json": plan, "run.key": b'{"public": "p", "secret": "s"}', "recipe.py": b"# recipe\n" * 2000,
              "checkpoints/step-2/model.safetensors": checkpoint}
    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(get=lambda ref: ref))  # the object store, faked
    away = {"run_dir": str(home), "scratch": str(tmp_path / "scratch"), "inputs": [inputs]}
    failures: list[BaseException] = []

    def actor(pool: str) -> None:
        try:
            for _ in range(25):
                args, _ = _into_copy([str(home / "plan.json"), pool, "0", "2", str(home / "checkpoints/step-2")],
                                     str(home / "logs" / f"{pool}-0.log"), away, "node-1")
                assert Plan.from_json(Path(args[0]).read_text()).run_dir == str(tmp_path / "scratch" / "run-node-1")
                assert (Path(args[4]) / "model.safetensors").read_bytes() == checkpoint
        except BaseException as err:  # noqa: BLE001 (a thread's failure is the test's)
            failures.append(err)

    threads = [threading.Thread(target=actor, args=(pool,)) for pool in ("actor", "score")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not failures, failures[0]
    assert not [p for p in (tmp_path / "scratch").rglob("*") if p.name.startswith(".")]  # no temporary left

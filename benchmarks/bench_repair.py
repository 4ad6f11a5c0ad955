"""Does the repair recipe use its feedback? Three held-out pass rates, before and after training.

    python benchmarks/bench_repair.py                        # train recipes/code_repair.py (60 steps), score
    python benchmarks/bench_repair.py --steps 20 --tasks 80  # shorter
    python benchmarks/bench_repair.py --run DIR              # score the last weights of a finished run

Scored on the held-out tasks (hidden tests only), for the warm start and for the trained policy:
- **turn 1**: one attempt (pass@1);
- **K turns with feedback**: the recipe's own episode, which repairs on the public tests' failure;
- **pass@K without feedback**: K independent attempts, any passes (the unbiased estimator from 2K samples).
More turns beat one turn just by sampling again, so the feedback is used only if "K turns with feedback"
beats pass@K. The episodes run in this process on the run's engine (nodes/episodes/worker.py).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "code_repair.py"


def load_recipe(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("code_repair_recipe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def runner_for(recipe: Any, agent: Any, weights: Path | None) -> Any:
    """An episode runner in this process on the recipe's model (and trained weights), with the settings the
    recipe's episode node runs with (its max_new_tokens)."""
    from areal.graph.recipe import load_recipe
    from areal.nodes.episodes.worker import local_runner

    return local_runner(agent, load_recipe(recipe.__file__).config, weights=weights)


def rewards(recipe: Any, agent: Any, weights: Path | None, tasks: list[dict], samples: int) -> list[list[float]]:
    """Per task, the rewards of `samples` episodes of `agent`."""
    from areal.graph.batch import Batch
    from areal.graph.meta import GroupMeta
    from areal.graph.roles import FAILED

    runner = runner_for(recipe, agent, weights)
    for g, task in enumerate(tasks):
        ids = torch.tensor([g])
        runner.submit(Batch({"prompt": [task["prompt"]], "tests": [task["tests"]], "group_id": ids,
                             "sample_id": ids.clone()}), GroupMeta(group=g, samples=samples, admitted_at=0))
    scored: dict[int, list[float]] = {}
    while runner.pending():
        for batch, meta in runner.step():
            failed = [why for why in batch[FAILED] if why]
            if failed:
                raise SystemExit(f"an episode failed: {failed[0]}")
            scored[meta.group] = batch["reward"].tolist()
    runner.close()
    return [scored[g] for g in range(len(tasks))]


def pass_rates(recipe: Any, weights: Path | None, tasks: list[dict], k: int) -> dict[str, float]:
    from areal.data.code_repair import split_tests
    from areal.rewards import mean_pass_at_k

    async def one_try(task, llm):
        _, hidden = split_tests(task["tests"])
        reply = await llm.generate(task["prompt"])
        return (await asyncio.to_thread(recipe.judge.score, task["prompt"] + reply.text, hidden)).reward

    tries = rewards(recipe, one_try, weights, tasks, 2 * k)
    repaired = rewards(recipe, recipe.repair, weights, tasks, k)
    solved = [[r >= 1.0 - 1e-9 for r in rs] for rs in tries]
    return {
        "turn 1": mean_pass_at_k([(len(s), sum(s)) for s in solved], 1),
        f"{k} turns with feedback": sum(r >= 1.0 - 1e-9 for rs in repaired for r in rs) / sum(map(len, repaired)),
        f"pass@{k} without feedback": mean_pass_at_k([(len(s), sum(s)) for s in solved], k),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", type=Path, default=RECIPE)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--tasks", type=int, default=None, help="held-out tasks scored (default: all)")
    parser.add_argument("--run", type=Path, default=None, help="a finished run of the recipe: score its last weights")
    parser.add_argument("--set", dest="extra", action="append", default=[], help="overrides for the training run")
    args = parser.parse_args()
    from areal.data import builtin_code_tasks

    recipe = load_recipe(args.recipe)
    k = recipe.TURNS
    tasks = list(builtin_code_tasks("test").tasks)[: args.tasks]
    run, train_s = args.run, None
    if run is None:
        run = Path(tempfile.mkdtemp(prefix="areal-repair-"))
        cmd = [sys.executable, "-m", "areal.cli", "run", str(args.recipe), "--run-dir", str(run), "-q",
               "--set", f"steps={args.steps}", *[x for item in args.extra for x in ("--set", item)]]
        print(f"training: {' '.join(cmd)}", file=sys.stderr, flush=True)
        started = time.perf_counter()
        subprocess.run(cmd, check=True)
        train_s = time.perf_counter() - started
    weights = max((run / "weights" / "actor").glob("v*.safetensors"))
    rows = {}
    for label, path in (("warm start (v0)", None), (f"trained ({weights.stem})", weights)):
        print(f"scoring {label} on {len(tasks)} held-out tasks ...", file=sys.stderr, flush=True)
        rows[label] = pass_rates(recipe, path, tasks, k)
    names = list(next(iter(rows.values())))
    print(f"held-out tasks: {len(tasks)}; K = {k}; run {run}" + (f"; training {train_s:.0f} s" if train_s else ""))
    print(f"{'policy':<22}" + "".join(f"{n:>28}" for n in names) + f"{'feedback vs pass@K':>22}")
    for label, rates in rows.items():
        gap = rates[names[1]] - rates[names[2]]
        print(f"{label:<22}" + "".join(f"{rates[n]:>28.3f}" for n in names) + f"{gap:>+22.3f}")


if __name__ == "__main__":
    main()

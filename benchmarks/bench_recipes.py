"""Recipes side by side at equal trained samples: does one learn faster per sample it trains?

    python benchmarks/bench_recipes.py                                   # code_rl vs dapo_rl, sync
    python benchmarks/bench_recipes.py recipes/code_rl.py recipes/kl_rl.py --seeds 3 --steps 40

Every recipe runs with the same seeds, steps, batch and mode (sync by default: its learning does
not depend on the machine's load, so other work beside the benchmark cannot tilt it). All of them
train B groups per step, so equal steps are equal trained samples. Printed per recipe (mean ± spread
over seeds): held-out pass@1 before and after, its gain and the gain's ratio to the first recipe's,
the groups started per group trained (what a filter costs in generation), and wall-clock.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from bench_async import ROOT, run_once, spread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipes", type=Path, nargs="*",
                        default=[ROOT / "recipes" / "code_rl.py", ROOT / "recipes" / "dapo_rl.py"])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--mode", choices=["sync", "async"], default="sync")
    parser.add_argument("--staleness", type=int, default=2, help="η in async mode")
    parser.add_argument("--set", dest="extra", action="append", default=[], help="extra overrides for every run")
    args = parser.parse_args()
    eta = 0 if args.mode == "sync" else args.staleness
    extra = args.extra + ["checkpoint.interval_steps=0", f"eval.interval_steps={args.steps}"]
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="areal-bench-recipes-") as tmp:
        for seed in range(args.seeds):
            for recipe in args.recipes:
                print(f"running {recipe.name} seed={seed} ...", file=sys.stderr, flush=True)
                results.setdefault(recipe.name, []).append(
                    run_once(recipe, args.mode, eta, seed, args.steps, extra, Path(tmp), tag=recipe.stem))
    print(f"\n{args.steps} steps × {args.seeds} seed(s), {args.mode} (η = {eta}); held-out pass@1 on the same tasks; "
          "equal trained samples per step in every recipe\n")
    header = (f"{'recipe':<16} {'pass@1 start':>14} {'pass@1 end':>14} {'gain':>15} {'gain vs first':>14} "
              f"{'started/trained':>16} {'wall s':>16}")
    print(header)
    print("-" * len(header))
    base = None
    for name, runs in results.items():
        gains = [r["pass_last"] - r["pass_first"] for r in runs]
        mean_gain = statistics.mean(gains)
        base = mean_gain if base is None else base
        ratio = f"{mean_gain / base:.2f}x" if base > 0 else "—"
        cost = [r["started"] / r["trained"] for r in runs]
        print(f"{name:<16} {spread([r['pass_first'] for r in runs]):>14} {spread([r['pass_last'] for r in runs]):>14} "
              f"{spread(gains):>15} {ratio:>14} {spread(cost):>16} {spread([r['wall_s'] for r in runs]):>16}")


if __name__ == "__main__":
    main()

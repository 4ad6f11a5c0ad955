"""Async vs sync on the same recipe, seeds and hardware.

    python benchmarks/bench_async.py                 # sync, async η=1,2,4; 3 seeds each
    python benchmarks/bench_async.py --quick         # a smoke run: 1 seed, few steps

For every (mode, seed) it runs `areal run` in a fresh run directory and reads metrics.jsonl.
Printed per mode (mean ± sd over seeds; every seed starts from the same shipped model): trained samples/s
and its ratio to the same seed's sync run,
wall-clock to reach a reward threshold, final reward and held-out pass@1, and the ideal
overlap bound (T_gen + T_train) / max(T_gen, T_train) measured in the sync runs, where the
two phases do not overlap: T_train is the trainer's own time per step (proximal pass and
update), T_gen the rest of the step (generation and reward).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = [("sync", 0), ("async", 1), ("async", 2), ("async", 4)]


def run_dir_of(out: Path, mode: str, eta: int, seed: int, tag: str = "") -> Path:
    return out / f"{mode}-eta{eta}-seed{seed}{'-' + tag if tag else ''}"


def run_once(recipe: Path, mode: str, eta: int, seed: int, steps: int, extra: list[str], out: Path,
             tag: str = "") -> dict:
    run_dir = run_dir_of(out, mode, eta, seed, tag)
    cmd = [sys.executable, "-m", "areal.cli", "run", str(recipe), "--run-dir", str(run_dir), "-q",
           "--set", f"mode={mode}", "--set", f"staleness={eta}", "--set", f"seed={seed}",
           "--set", f"data.seed={seed}", "--set", f"steps={steps}"]
    for item in extra:
        cmd += ["--set", item]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return summarise(run_dir)


def summarise(run_dir: Path) -> dict:
    """What the benchmarks report of one finished run, read from its metrics.jsonl."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps_ = [r for r in lines if r["kind"] == "step"]
    evals = [r for r in lines if r["kind"] == "eval"]
    walls = [0.0] + [r["wall_s"] for r in steps_]
    train_s = [r["update_s"] + r["prox_s"] for r in steps_]
    step_s = [b - a for a, b in zip(walls, walls[1:])]
    return {
        "samples_per_s": steps_[-1]["samples_per_s"],
        "wall_s": steps_[-1]["wall_s"],
        "started": steps_[-1]["started"],  # samples admitted by the last step (a filter's refills included)
        "trained": steps_[-1]["trained"],
        "rewards": [r["reward_mean"] for r in steps_],
        "walls": walls[1:],
        "final_reward": statistics.mean(r["reward_mean"] for r in steps_[-5:]),
        "pass_first": evals[0]["pass@1"] if evals else None,
        "pass_last": evals[-1]["pass@1"] if evals else None,
        "t_train": statistics.median(train_s),
        "t_step": statistics.median(step_s),
        "staleness": sum((Counter(r["staleness"]) for r in steps_), Counter()),
        # how hard the update pushed against its trust region, and how far π_prox was from π_behav
        "clip_fraction": statistics.mean(r.get("clip_fraction", 0.0) for r in steps_),
        "importance_weight_max": statistics.mean(r.get("importance_weight_max", 1.0) for r in steps_),
    }


def time_to(result: dict, threshold: float, window: int = 3) -> float | None:
    rewards = result["rewards"]
    for i in range(window - 1, len(rewards)):
        if statistics.mean(rewards[i - window + 1 : i + 1]) >= threshold:
            return result["walls"][i]
    return None


def spread(values: list[float]) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "code_rl.py")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="1 seed, 6 steps")
    parser.add_argument("--set", dest="extra", action="append", default=[], help="extra overrides for every run")
    args = parser.parse_args()
    seeds = 1 if args.quick else args.seeds
    steps = 6 if args.quick else args.steps
    extra = args.extra + ["eval.interval_steps=0", "checkpoint.interval_steps=0"]
    results: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="areal-bench-async-") as tmp:
        for seed in range(seeds):
            for mode, eta in MODES:
                print(f"running {mode} η={eta} seed={seed} ...", file=sys.stderr, flush=True)
                results.setdefault((mode, eta), []).append(
                    run_once(args.recipe, mode, eta, seed, steps, extra, Path(tmp)))
    sync = results[("sync", 0)]
    threshold = statistics.mean(r["rewards"][0] for r in sync) + 0.5 * (
        statistics.mean(r["final_reward"] for r in sync) - statistics.mean(r["rewards"][0] for r in sync))
    t_train = statistics.mean(r["t_train"] for r in sync)
    t_gen = statistics.mean(r["t_step"] for r in sync) - t_train
    ideal = (t_gen + t_train) / max(t_gen, t_train)
    print(f"\n{steps} steps × {seeds} seed(s); recipe {args.recipe.name}; reward threshold {threshold:.3f} "
          f"(3-step mean); sync phases: T_gen {t_gen:.2f} s, T_train {t_train:.2f} s, ideal overlap {ideal:.2f}x\n")
    header = f"{'mode':<12} {'samples/s':>16} {'vs sync (±sd)':>15} {'of ideal':>9} {'to threshold s':>16} " \
             f"{'final reward':>16} {'pass@1 end':>14}"
    print(header)
    print("-" * len(header))
    for (mode, eta), runs in results.items():
        reach = [t for t in (time_to(r, threshold) for r in runs) if t is not None]
        reached = f"{spread(reach)} ({len(reach)}/{len(runs)})" if reach else f"— (0/{len(runs)})"
        # seed by seed against that seed's sync run: every seed starts from the same shipped model
        ratios = [r["samples_per_s"] / s["samples_per_s"] for r, s in zip(runs, sync, strict=True)]
        ratio = statistics.mean(ratios)
        print(f"{mode + ' η=' + str(eta):<12} {spread([r['samples_per_s'] for r in runs]):>16} "
              f"{spread(ratios):>14}x "
              f"{ratio / ideal:>8.0%} {reached:>16} {spread([r['final_reward'] for r in runs]):>16} "
              f"{spread([r['pass_last'] for r in runs if r['pass_last'] is not None]):>14}")


if __name__ == "__main__":
    main()

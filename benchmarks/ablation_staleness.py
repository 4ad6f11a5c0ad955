"""Staleness ablation: decoupled PPO vs standard PPO (and the proximal shortcut) as η grows.

    python benchmarks/ablation_staleness.py                       # η 0,1,2,4,8 × 3 objectives × 3 seeds
    python benchmarks/ablation_staleness.py --etas 0 4 --seeds 1  # a reduced grid
    python benchmarks/ablation_staleness.py --lag bound           # η as a bound on a real async run
    python benchmarks/ablation_staleness.py --quick               # a smoke run
    python benchmarks/ablation_staleness.py --runs DIR --tabulate # the table again from kept runs

Every run trains the same number of samples (`--steps` × batch × group). η = 0 runs once per
seed, in sync mode: on-policy, π_behav = π_prox, so the three objectives are the same loss (up to
the rounding of the proximal pass), and the plot starts every objective's line from that run.

How staleness is made (`--lag`):
- `fixed` (default): `mode=lagged`. Generation and training alternate as in sync mode, but the
  generators always sample from the policy exactly η versions old, so every objective trains on
  the same lag, the worst case the bound η allows. This is the controlled experiment: on 2 cores a
  real async run's lag depends on how fast each objective's trainer is (the decoupled objective's
  proximal pass slows it, so it sees more lag than standard PPO), which confounds the comparison.
- `bound`: `mode=async` with staleness η. The lag is whatever the overlap produces, at most η;
  the table reports its mean.
Writes the table (markdown) to --out and, with matplotlib, a PNG of held-out pass@1 against η
per objective beside it. Beside pass@1 the table reports, per cell, the share of tokens whose
clipped PPO term was active and the mean of each step's largest π_prox/π_behav: whether staleness
made the trust region or the importance weights matter at all.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from bench_async import ROOT, run_dir_of, run_once, spread, summarise

OBJECTIVES = ("decoupled", "standard", "decoupled-shortcut")


def mean_lag(result: dict) -> float:
    hist = result["staleness"]
    total = sum(hist.values())
    return sum(int(lag) * n for lag, n in hist.items()) / total if total else 0.0


def table(results: dict[tuple[int, str], list[dict]], header: str) -> str:
    lines = [header, "", "| η | objective | held-out pass@1 (start → end) | mean lag | clipped tokens "
             "| max π_prox/π_behav | trained samples/s | wall s |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (eta, objective), runs in sorted(results.items()):
        objective = "any (sync)" if eta == 0 else objective
        first = spread([r["pass_first"] for r in runs])
        last = spread([r["pass_last"] for r in runs])
        lines.append(f"| {eta} | {objective} | {first} → {last} | {statistics.mean(mean_lag(r) for r in runs):.2f} "
                     f"| {statistics.mean(r['clip_fraction'] for r in runs):.2%} "
                     f"| {statistics.mean(r['importance_weight_max'] for r in runs):.2f} "
                     f"| {spread([r['samples_per_s'] for r in runs])} | {spread([r['wall_s'] for r in runs])} |")
    return "\n".join(lines)


def plot(results: dict[tuple[int, str], list[dict]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install 'areal[plot]')", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for objective in OBJECTIVES:
        points = sorted((eta, [r["pass_last"] for r in runs]) for (eta, o), runs in results.items()
                        if o == objective or eta == 0)
        if not points:
            continue
        etas = [e for e, _ in points]
        means = [statistics.mean(v) for _, v in points]
        errs = [statistics.stdev(v) if len(v) > 1 else 0.0 for _, v in points]
        ax.errorbar(etas, means, yerr=errs, marker="o", capsize=3, label=objective)
    ax.set_xlabel("staleness bound η")
    ax.set_ylabel("final held-out pass@1")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "code_rl.py")
    parser.add_argument("--etas", type=int, nargs="+", default=[0, 1, 2, 4, 8])
    parser.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=OBJECTIVES)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--lag", choices=("fixed", "bound"), default="fixed",
                        help="fixed: every sample exactly η versions old (mode=lagged); bound: async, lag <= η")
    parser.add_argument("--quick", action="store_true", help="η 0 and 2, 1 seed, 4 steps")
    parser.add_argument("--out", type=Path, default=None, help="write the markdown table here (and the PNG beside)")
    parser.add_argument("--set", dest="extra", action="append", default=[], help="extra overrides for every run")
    parser.add_argument("--runs", type=Path, default=None, help="keep every run's directory here (default: a temp dir)")
    parser.add_argument("--tabulate", action="store_true", help="run nothing: the table from the runs in --runs")
    args = parser.parse_args()
    if args.tabulate and args.runs is None:
        parser.error("--tabulate reads the runs kept with --runs DIR; give that DIR")
    etas, seeds, steps = ([0, 2], 1, 4) if args.quick else (args.etas, args.seeds, args.steps)
    extra = [*args.extra, f"eval.interval_steps={steps}", "checkpoint.interval_steps=0"]
    results: dict[tuple[int, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="areal-ablation-") as tmp:
        runs = args.runs or Path(tmp)
        for seed in range(seeds):
            for eta in etas:
                for objective in (args.objectives[:1] if eta == 0 else args.objectives):
                    mode = "sync" if eta == 0 else ("lagged" if args.lag == "fixed" else "async")
                    if args.tabulate:
                        run = summarise(run_dir_of(runs, mode, eta, seed, objective))
                    else:
                        print(f"running η={eta} {objective} seed={seed} ...", file=sys.stderr, flush=True)
                        run = run_once(args.recipe, mode, eta, seed, steps,
                                       [*extra, f"trainer.objective={objective}"], runs, tag=objective)
                    results.setdefault((eta, objective), []).append(run)
    lag = "every sample exactly η versions old (mode=lagged)" if args.lag == "fixed" else "lag at most η (mode=async)"
    header = (f"{steps} steps × {seeds} seed(s) per cell, {lag}, recipe {args.recipe.name}, overrides "
              f"{' '.join(args.extra) or '(none)'}; pass@1 mean ± stdev over seeds")
    text = table(results, header)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
        plot(results, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()

"""The staleness policies' learning table (#33): the code recipe under each policy and η, at equal wall time.

    python benchmarks/bench_staleness_learning.py                          # 5 policies × η 2, 4 × seeds 0 1 2, 6 min
    python benchmarks/bench_staleness_learning.py --policies strict token --etas 2 --seeds 0 --minutes 3
    python benchmarks/bench_staleness_learning.py --parallel 4 --cores-per-run 4    # 4 runs at once, 4 own cores each
    python benchmarks/bench_staleness_learning.py --out DIR --tabulate              # the table of the runs kept in DIR
    python benchmarks/bench_staleness_learning.py --tasks chains      # answers with a heavy tail of lengths

Each run is `areal run recipes/code_rl.py` with `staleness_policy`, `staleness` and `max_minutes` set and `steps`
out of reach, so every run trains for the same wall time and is then scored by its last held-out round (the
recipe's rounds: 8 samples of each of the 237 held-out tasks). Printed per policy and η, over seeds (mean ±
standard error): held-out pass@1 at the start and at the end, the versions reached, trained samples/s, the lag
of the trained samples (their step minus the version of their oldest token: mean, p99, max), the share of
trained tokens older than η (the admission policy trains them; recycle with `recycle_keep_prefix`), the share
of generated tokens wasted (dropped with their group, or masked), and the mean trained output length (does a
policy favour short answers?). A second table says where the time went: each worker's busy share, the share of
its generator's time spent re-reading running rows under new weights, the tokens it generated a second and the
share of outputs cut at max_new_tokens. A third lists each run: its gain beside the signs of a run going wrong
(the most outputs cut in one step, the largest behaviour importance weight).
`--tasks chains` trains on the chain tasks instead (areal/data/chain_tasks.py), whose answers have the heavy tail
of lengths the recipe's tasks lack.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections import Counter
from pathlib import Path

from bench_first_run import ROOT, Run, pinned_cores, run_all

POLICIES = ("strict", "admission", "drop", "token", "recycle")
# the task sets a run can train on: the recipe's own, or the chain tasks, whose answers have the heavy tail of
# lengths the built-in ones lack (areal/data/chain_tasks.py), with the tiny coder warm-started on them
TASKS = {
    "code": [],
    "chains": ["data.path=builtin:chains", "model=builtin:tiny-chainer", "generation.max_new_tokens=400"],
}


RUNAWAY_CUT = 20  # outputs cut at max_new_tokens in one step: past this a run is drifting to endless answers
LATE_STEPS = 20  # a run's training reward is averaged over this many last steps, beside its held-out gain


def prices(run_dir: Path) -> dict[str, float]:
    """What a run trained and what it cost, from its step records."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in lines if r["kind"] == "step"]
    last = steps[-1]
    lags = sorted(sum((Counter({int(k): v for k, v in s["staleness"].items()}) for s in steps), Counter()).elements())
    tokens = sum(s["tokens"] for s in steps)  # output tokens of the trained samples, masked ones among them
    masked = sum(s.get("masked_tokens", 0) for s in steps)
    stale = sum(s.get("stale_tokens", 0) for s in steps)
    dropped = last["dropped_tokens"]
    rebuild = [s["generator_rebuild_share"] for s in steps if "generator_rebuild_share" in s]
    cut = [b["over_long"] - a["over_long"] for a, b in zip([{"over_long": 0}, *steps], steps)]  # per step
    generated = [s["generated_tokens_per_s"] for s in steps if "generated_tokens_per_s" in s]
    return {
        **{f"busy {worker}": statistics.mean(s["busy"].get(worker, 0.0) for s in steps) for worker in last["busy"]},
        "rebuild": statistics.mean(rebuild) if rebuild else math.nan,
        "generated_per_s": statistics.mean(generated) if generated else math.nan,
        "version": last["version"],
        "samples_per_s": last["trained_samples"] / last["wall_s"],
        "lag_mean": statistics.mean(lags) if lags else math.nan,
        "lag_p99": lags[min(len(lags) - 1, int(0.99 * len(lags)))] if lags else 0,
        "lag_max": max(lags, default=0),
        "stale": stale / (tokens - masked) if tokens > masked else 0.0,
        "wasted": (masked + dropped) / (tokens + dropped) if tokens + dropped else 0.0,
        "length": tokens / last["trained_samples"],
        "cut": last["over_long"] / last["started"] if last["started"] else 0.0,
        "cut_most": max(cut),
        "runaway_at": next((s["version"] for s, n in zip(steps, cut) if n >= RUNAWAY_CUT), None),
        "weight_max": max(s.get("importance_weight_max", 0.0) for s in steps),
        "late_reward": statistics.mean(s["reward_mean"] for s in steps[-LATE_STEPS:]),
    }


def _mean_se(values: list[float], scale: float = 1.0, digits: int = 3) -> str:
    mean = statistics.mean(values) * scale
    if len(values) < 2:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {statistics.stdev(values) * scale / math.sqrt(len(values)):.{digits}f}"


def _column(costs: list[dict[str, float]], key: str, scale: float = 1.0, digits: int = 1) -> str:
    return _mean_se([c[key] for c in costs], scale, digits)


def failure(run: Run) -> str:
    """Why a run has no place in the table ("" when it has one): its error, or no held-out round at its end."""
    return run.error or ("" if len(run.rounds) >= 2 else "no last held-out round: the run did not finish")


def report(runs: list[Run]) -> str:
    lines = ["| policy | η | seeds | held-out pass@1: start | end | gain (points) | versions | trained samples/s "
             "| lag mean / p99 / max | trained tokens > η | generated tokens wasted | trained length |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for variant in dict.fromkeys(r.variant for r in runs):
        done = [r for r in runs if r.variant == variant and not failure(r)]
        failed = [r for r in runs if r.variant == variant and failure(r)]
        policy, eta = variant.split("-eta")
        if not done:
            lines.append(f"| {policy} | {eta} | 0 of {len(failed)} (failed: {failure(failed[0])[:120]!r}) "
                         "| | | | | | | | | |")
            continue
        costs = [prices(r.run_dir) for r in done]
        start = [r.rounds[0]["pass@1"] for r in done]
        end = [r.rounds[-1]["pass@1"] for r in done]

        gain = _mean_se([b - a for a, b in zip(start, end, strict=True)], 100, 1)
        lags = (f"{_column(costs, 'lag_mean', digits=2)} / {max(c['lag_p99'] for c in costs)} / "
                f"{max(c['lag_max'] for c in costs)}")
        lines.append(
            f"| {policy} | {eta} | {len(done)}{f' ({len(failed)} failed)' if failed else ''} | {_mean_se(start)} "
            f"| {_mean_se(end)} | {gain} | {_column(costs, 'version', digits=0)} "
            f"| {_column(costs, 'samples_per_s', digits=2)} | {lags} | {_column(costs, 'stale', 100)} % "
            f"| {_column(costs, 'wasted', 100)} % | {_column(costs, 'length')} |")
    return "\n".join(lines)


def time_report(runs: list[Run]) -> str:
    """Where each variant's time went: every worker's busy share, its generator's time re-reading running rows under
    new weights (the price of interruptible generation) and the tokens it generated a second, averaged over the
    step records."""
    lines = []
    for variant in dict.fromkeys(r.variant for r in runs):
        costs = [prices(r.run_dir) for r in runs if r.variant == variant and not failure(r)]
        if not costs:
            continue
        workers = [k for k in costs[0] if k.startswith("busy ")]
        if not lines:
            lines = [f"| policy | η | seeds | {' | '.join(workers)} | generator time re-reading rows "
                     "| generated tokens/s | outputs cut |", "|---|---|---|" + "---|" * (len(workers) + 3)]
        policy, eta = variant.split("-eta")
        rebuild = "—" if any(math.isnan(c["rebuild"]) for c in costs) else f"{_column(costs, 'rebuild', 100)} %"
        generated = "—" if any(math.isnan(c["generated_per_s"]) for c in costs) else _column(costs, "generated_per_s",
                                                                                             digits=0)
        lines.append(f"| {policy} | {eta} | {len(costs)} | "
                     + " | ".join(_column(costs, w, digits=2) for w in workers)
                     + f" | {rebuild} | {generated} | {_column(costs, 'cut', 100)} % |")
    return "\n".join(lines)


def run_report(runs: list[Run]) -> str:
    """Each run on its own: its gain beside its mean training reward over its last LATE_STEPS steps (the gain is
    one held-out round at one version, which moves more between versions than its sampling error says) and the
    two signs of a run going wrong, outputs cut at max_new_tokens (the most in one step, and the version where
    a step first cut RUNAWAY_CUT) and the largest behaviour importance weight π_prox/π_behav of any step."""
    lines = [f"| policy | η | seed | gain (points) | training reward, last {LATE_STEPS} steps | versions | outputs cut "
             f"| most cut in a step (first ≥ {RUNAWAY_CUT} at) | largest importance weight |",
             "|---|---|---|---|---|---|---|---|---|"]
    for run in (r for r in runs if not failure(r)):
        c = prices(run.run_dir)
        policy, eta = run.variant.split("-eta")
        gain = 100 * (run.rounds[-1]["pass@1"] - run.rounds[0]["pass@1"])
        at = f" (v{c['runaway_at']})" if c["runaway_at"] is not None else ""
        lines.append(f"| {policy} | {eta} | {run.seed} | {gain:+.1f} | {c['late_reward']:.2f} | {c['version']} "
                     f"| {100 * c['cut']:.1f} % | {c['cut_most']}{at} | {c['weight_max']:.1f} |")
    return "\n".join(lines)


def _table_order(run_dir: Path) -> tuple[int, int, int]:
    """A kept run's place in the tables: its η, its policy in POLICIES' order, its seed (a run's own order)."""
    variant, _, seed = run_dir.name.rpartition("-s")
    policy, _, eta = variant.partition("-eta")
    return int(eta), POLICIES.index(policy) if policy in POLICIES else len(POLICIES), int(seed)


def kept_runs(out: Path) -> list[Run]:
    """The finished runs kept in `out` (POLICY-etaN-sS directories), as `run_all` would have left them."""
    runs = []
    for run_dir in sorted((p for p in out.iterdir() if p.is_dir()), key=_table_order):
        variant, _, seed = run_dir.name.rpartition("-s")
        run = Run(variant, [], int(seed), run_dir)
        lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        run.rounds = [r for r in lines if r["kind"] == "eval"]
        runs.append(run)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "code_rl.py")
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    parser.add_argument("--etas", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--minutes", type=float, default=6.0, help="wall-clock of training in every run")
    parser.add_argument("--tasks", choices=TASKS, default="code", help="chains: answers with a heavy tail of lengths")
    parser.add_argument("--set", dest="common", action="append", default=[], help="a setting of every run")
    parser.add_argument("--parallel", type=int, default=1, help="runs at once")
    parser.add_argument("--cores-per-run", type=int, default=0, help="pin each run to this many cores of its own")
    parser.add_argument("--out", type=Path, default=None, help="keep the run directories here (default: runs/)")
    parser.add_argument("--tabulate", action="store_true", help="run nothing: the table of the runs kept in --out")
    args = parser.parse_args()
    if args.tabulate:
        if args.out is None or not args.out.is_dir():
            parser.error("--tabulate reads the runs kept in --out DIR: give the directory")
        kept = kept_runs(args.out)
        print(f"{report(kept)}\n\n{time_report(kept)}\n\n{run_report(kept)}")
        return
    core_sets = pinned_cores(parser, args.parallel, args.cores_per_run)
    out = args.out or ROOT / "runs" / f"staleness-learning-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    # held-out rounds at the start and the end only: a faster policy would otherwise pay for more rounds
    runs = [Run(f"{policy}-eta{eta}", [f"staleness_policy={policy}", f"staleness={eta}", f"max_minutes={args.minutes}",
                                       "steps=100000", "eval.interval_steps=0"], seed,
                out / f"{policy}-eta{eta}-s{seed}")
            for seed in args.seeds for eta in args.etas for policy in args.policies]
    run_all(args.recipe, runs, TASKS[args.tasks] + args.common, args.parallel, timeout_s=args.minutes * 60 + 900,
            core_sets=core_sets)
    print(f"{args.minutes:g} minutes of training a run, then the last held-out round; runs in {out}\n")
    print(f"{report(runs)}\n\n{time_report(runs)}\n\n{run_report(runs)}")


if __name__ == "__main__":
    main()

"""The first run, measured as a newcomer meets it: the default recipe over seeds, every evaluation round.

    python benchmarks/bench_first_run.py                                   # code_rl, seeds 0 1 2, one at a time
    python benchmarks/bench_first_run.py --parallel 3 --cores-per-run 2    # three at once, each on 2 own cores
    python benchmarks/bench_first_run.py --variant lr6=trainer.lr=6e-4,steps=100 --variant default=

Each run is `areal run RECIPE --set seed=S --set data.seed=S` plus the variant's settings. A run given
its own cores (`--cores-per-run`) is pinned to them with every process it starts, so runs side by side
do not share a core. Printed per run: held-out pass@1 at every evaluation round with its standard
error, the gain ± its error, the lowest round against the start, and the wall-clock in all (process
start to exit) and of training; where its CPU went (each pool's workers with every process they
started, the code sandbox's among them, and the controller: the run's status.json); then, per
variant, how many seeds meet the first run's bar (issue #38): a gain of at least 15 points, no round
below the start, at most 8 minutes in all, and a standard error under 1 point in every round.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BAR_GAIN_POINTS, BAR_WALL_S, BAR_SE_POINTS = 15.0, 480.0, 1.0


@dataclass
class Run:
    variant: str
    settings: list[str]
    seed: int
    run_dir: Path
    cores: list[int] | None = None  # pinned to these, or any
    slot: int = -1
    process: subprocess.Popen | None = None
    started: float = 0.0
    wall_s: float = math.nan
    rounds: list[dict] = field(default_factory=list)
    train_wall_s: float = math.nan
    cpu_s: dict[str, float] = field(default_factory=dict)  # by pool (its workers' process trees), and controller
    error: str = ""


def parse_variant(text: str) -> tuple[str, list[str]]:
    """'name=key=value,key=value' -> (name, ['key=value', ...]); 'name=' has no settings."""
    name, sep, rest = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected NAME=key=value,key=value (or NAME=)")
    settings = [item for item in rest.split(",") if item]
    for item in settings:
        if "=" not in item:
            raise argparse.ArgumentTypeError(f"--variant {name}: setting {item!r} is not key=value")
    return name, settings


def command(recipe: Path, run: Run, common: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "areal.cli", "run", str(recipe), "--run-dir", str(run.run_dir), "-q",
           "--set", f"seed={run.seed}", "--set", f"data.seed={run.seed}"]
    for item in common + run.settings:
        cmd += ["--set", item]
    return cmd


def start(recipe: Path, run: Run, common: list[str]) -> None:
    cores = run.cores
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    run.started = time.perf_counter()
    with open(run.run_dir.with_suffix(".log"), "w") as log:  # the child keeps its own descriptor
        run.process = subprocess.Popen(command(recipe, run, common), stdout=log, stderr=subprocess.STDOUT,
                                       preexec_fn=pin, cwd=ROOT)


def finish(run: Run) -> None:
    """Read what a finished run measured (its metrics.jsonl), or why it failed."""
    run.wall_s = time.perf_counter() - run.started
    assert run.process is not None
    if run.process.returncode != 0:
        tail = run.run_dir.with_suffix(".log").read_text()[-1500:]
        run.error = f"exit {run.process.returncode}: {tail}"
        return
    lines = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    run.rounds = [r for r in lines if r["kind"] == "eval"]
    steps = [r for r in lines if r["kind"] == "step"]
    run.train_wall_s = steps[-1]["wall_s"] if steps else math.nan
    run.cpu_s = cpu_by_pool(run.run_dir, steps[-1] if steps else {})


def cpu_by_pool(run_dir: Path, last_step: dict) -> dict[str, float]:
    """CPU seconds of each pool's workers at the end (status.json: their last reports), and the controller's."""
    status = json.loads((run_dir / "status.json").read_text()) if (run_dir / "status.json").exists() else {}
    cpu: dict[str, float] = {}
    for worker in status.get("workers", {}).values():
        if "cpu_s" in worker:  # a run of code older than these reports has none
            cpu[worker["pool"]] = cpu.get(worker["pool"], 0.0) + worker["cpu_s"]
    if cpu and "controller_cpu_s" in last_step:
        cpu["controller"] = last_step["controller_cpu_s"]
    return cpu


def cpu_line(run: Run) -> str:
    """'score 177 s (53 %) · actor 113 s (34 %) · ...; 1.70 cores': the run's CPU by pool, largest first."""
    total = sum(run.cpu_s.values())
    if not total:
        return "not reported"
    shares = " · ".join(f"{pool} {s:.0f} s ({100 * s / total:.0f} %)"
                        for pool, s in sorted(run.cpu_s.items(), key=lambda kv: -kv[1]))
    return f"{shares}; {total / run.wall_s:.2f} cores"


def run_all(recipe: Path, runs: list[Run], common: list[str], parallel: int, timeout_s: float,
            core_sets: list[list[int]] | None) -> None:
    """Every run, `parallel` at a time; slot i's runs are pinned to core_sets[i] when given."""
    pending: list[Run] = list(runs)
    running: list[Run] = []
    free_slots = list(range(parallel))
    while pending or running:
        while pending and free_slots:
            run = pending.pop(0)
            run.slot = free_slots.pop(0)
            run.cores = core_sets[run.slot] if core_sets else None
            start(recipe, run, common)
            print(f"started {run.variant} seed {run.seed} (cores {run.cores or 'any'})", file=sys.stderr, flush=True)
            running.append(run)
        time.sleep(0.5)  # polling the children's exit; nothing here waits on their timing
        for run in list(running):
            assert run.process is not None
            if run.process.poll() is None and time.perf_counter() - run.started > timeout_s:
                run.process.kill()
                run.process.wait()
            if run.process.poll() is not None:
                finish(run)
                running.remove(run)
                free_slots.append(run.slot)
                print(f"finished {run.variant} seed {run.seed} in {run.wall_s:.0f} s{' (failed)' if run.error else ''}",
                      file=sys.stderr, flush=True)


def gain(run: Run) -> tuple[float, float]:
    first, last = run.rounds[0], run.rounds[-1]
    error = math.hypot(first.get("pass@1_se", math.nan), last.get("pass@1_se", math.nan))
    return 100 * (last["pass@1"] - first["pass@1"]), 100 * error


def meets_bar(run: Run) -> dict[str, bool]:
    points, _ = gain(run)
    start_pass = run.rounds[0]["pass@1"]
    return {
        "gain": points >= BAR_GAIN_POINTS,
        "no dip": all(r["pass@1"] >= start_pass for r in run.rounds[1:]),
        "wall": run.wall_s <= BAR_WALL_S,
        "se": all(100 * r.get("pass@1_se", math.inf) < BAR_SE_POINTS for r in run.rounds),
    }


def report(runs: list[Run]) -> str:
    lines = ["| variant | seed | pass@1 by version (± SE) | gain ± SE | lowest round − start "
             "| wall in all / training |", "|---|---|---|---|---|---|"]
    for run in runs:
        if run.error or not run.rounds:
            lines.append(f"| {run.variant} | {run.seed} | failed: {run.error[:200]!r} | | | |")
            continue
        rounds = ", ".join(f"v{r['version']} {r['pass@1']:.3f}±{100 * r.get('pass@1_se', math.nan):.1f}"
                           for r in run.rounds)
        points, error = gain(run)
        dip = 100 * (min(r["pass@1"] for r in run.rounds[1:] or run.rounds) - run.rounds[0]["pass@1"])
        lines.append(f"| {run.variant} | {run.seed} | {rounds} | {points:+.1f} ± {error:.1f} | {dip:+.1f} | "
                     f"{run.wall_s:.0f} s / {run.train_wall_s:.0f} s |")
    lines += ["", "| variant | seed | CPU by pool over the run (its process trees), cores busy on average |",
              "|---|---|---|"]
    lines += [f"| {run.variant} | {run.seed} | {cpu_line(run)} |" for run in runs if not run.error]
    lines += ["", "| variant | seeds meeting the bar: gain ≥ 15 / no dip / ≤ 8 min / SE < 1 | mean gain |",
              "|---|---|---|"]
    for variant in dict.fromkeys(r.variant for r in runs):
        done = [r for r in runs if r.variant == variant and r.rounds]
        counts = {k: sum(meets_bar(r)[k] for r in done) for k in ("gain", "no dip", "wall", "se")}
        mean_gain = sum(gain(r)[0] for r in done) / len(done) if done else math.nan
        lines.append(f"| {variant} | {' / '.join(f'{v}/{len(done)}' for v in counts.values())} | {mean_gain:+.1f} |")
    return "\n".join(lines)


def pinned_cores(parser: argparse.ArgumentParser, parallel: int, cores_per_run: int) -> list[list[int]] | None:
    """The cores of each of `parallel` slots (`cores_per_run` own cores each), or None: runs use any core."""
    if not cores_per_run:
        return None
    available = sorted(os.sched_getaffinity(0))
    if cores_per_run * parallel > len(available):
        parser.error(f"--parallel {parallel} x --cores-per-run {cores_per_run} needs {cores_per_run * parallel} "
                     f"cores; this process may use {len(available)}")
    return [available[i * cores_per_run:(i + 1) * cores_per_run] for i in range(parallel)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "code_rl.py")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variant", type=parse_variant, action="append", default=[],
                        help="NAME=key=value,key=value: settings of one variant (default: the recipe as it is)")
    parser.add_argument("--set", dest="common", action="append", default=[], help="a setting of every run")
    parser.add_argument("--parallel", type=int, default=1, help="runs at once")
    parser.add_argument("--cores-per-run", type=int, default=0, help="pin each run to this many cores of its own")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="a run still going after this is killed")
    parser.add_argument("--out", type=Path, default=None, help="keep the run directories here (default: runs/)")
    parser.add_argument("--json", type=Path, default=None, help="also write every run's rounds here")
    args = parser.parse_args()
    variants = args.variant or [("default", [])]
    core_sets = pinned_cores(parser, args.parallel, args.cores_per_run)
    out = args.out or ROOT / "runs" / f"first-run-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    runs = [Run(name, settings, seed, out / f"{name}-s{seed}") for seed in args.seeds for name, settings in variants]
    run_all(args.recipe, runs, args.common, args.parallel, args.timeout_s, core_sets)
    table = report(runs)
    print(table)
    if args.json:
        args.json.write_text(json.dumps([{"variant": r.variant, "settings": r.settings, "seed": r.seed,
                                          "wall_s": r.wall_s, "train_wall_s": r.train_wall_s, "cpu_s": r.cpu_s,
                                          "rounds": r.rounds, "error": r.error} for r in runs], indent=1))


if __name__ == "__main__":
    main()

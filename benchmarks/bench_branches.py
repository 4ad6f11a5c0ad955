"""Two parallel branches of equal work: run as declared (a pool each, side by side) vs forced into one chain.

    python benchmarks/bench_branches.py                  # 3 interleaved repeats of both layouts
    python benchmarks/bench_branches.py --work 10 --steps 4 --repeats 1     # a smoke run

Both layouts run `_branches_recipe.py` through `areal run` with the same nodes, samples and work;
only the graph differs: in `chain` the right branch reads the left's output, so the compiler fuses
both into one pool and one process does them one after the other. Wall time counts from the
workers being ready to the last step (startup apart). From `calls.jsonl` it also reports the
branch work itself (the summed duration of the branches' calls) and how much of the left branch's
time the right one overlapped. The ratio parallel / chain is what the graph issue asks to be ≤ 0.65.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECIPE = HERE / "_branches_recipe.py"
BRANCHES = ("left", "right")


def run_layout(layout: str, work: int, steps: int, run_dir: Path) -> dict:
    env = {**os.environ, "BRANCHES_LAYOUT": layout, "BRANCHES_WORK": str(work)}
    cmd = [sys.executable, "-m", "areal.cli", "run", str(RECIPE), "--run-dir", str(run_dir), "-q",
           "--set", f"steps={steps}", "--set", "checkpoint.interval_steps=0"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{layout}: {' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return summarise(run_dir)


def summarise(run_dir: Path) -> dict:
    steps = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "step"]
    calls = [json.loads(line) for line in (run_dir / "calls.jsonl").read_text().splitlines()]
    spans = {b: [(c["start"], c["end"]) for c in calls if c["node"] == b] for b in BRANCHES}
    busy = {b: sum(end - start for start, end in spans[b]) for b in BRANCHES}
    return {
        "wall_s": steps[-1]["wall_s"],
        "branch_s": busy["left"] + busy["right"],
        "overlap": _overlap(spans["left"], spans["right"]) / busy["left"] if busy["left"] else 0.0,
        "processes": len({c["pid"] for c in calls if c["node"] in BRANCHES}),
    }


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Seconds during which a call of `a` and a call of `b` both ran (each list's calls are disjoint)."""
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def table(results: dict[str, list[dict]]) -> list[str]:
    chain = statistics.mean(r["wall_s"] for r in results["chain"])
    lines = [f"{'layout':<10} {'wall s':>16} {'branch work s':>16} {'left∩right':>11} {'processes':>10} "
             f"{'vs chain':>9}"]
    lines.append("-" * len(lines[0]))
    for layout, runs in results.items():
        walls = [r["wall_s"] for r in runs]
        lines.append(f"{layout:<10} {_spread(walls):>16} {_spread([r['branch_s'] for r in runs]):>16} "
                     f"{statistics.mean(r['overlap'] for r in runs):>10.0%} {runs[0]['processes']:>10} "
                     f"{statistics.mean(walls) / chain:>8.2f}x")
    return lines


def _spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=int, default=120, help="matmuls per sample in each branch")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each layout, interleaved")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"parallel": [], "chain": []}
    with tempfile.TemporaryDirectory(prefix="areal-bench-branches-") as tmp:
        for i in range(args.repeats):
            for layout in results:
                print(f"running {layout} ({i + 1}/{args.repeats}) ...", file=sys.stderr, flush=True)
                results[layout].append(run_layout(layout, args.work, args.steps, Path(tmp) / f"{layout}-{i}"))
    print(f"\n{args.steps} steps of 4 groups × 4 samples, {args.work} matmuls (128×128) per sample in each branch; "
          f"{os.cpu_count()} CPU cores\n")
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()

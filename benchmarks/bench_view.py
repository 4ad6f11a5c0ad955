"""Training rate with the view open and closed: the same recipe and settings, runs interleaved.

    python benchmarks/bench_view.py                  # 3 rounds of code_rl: closed/open, then open/closed, ...
    python benchmarks/bench_view.py --rounds 2 --spans-off   # and a third arm without span recording

"Open" is `areal run --view` with a client that asks the page's questions at the page's rates (live every 1 s,
metrics every 2 s, samples every 5 s, as static/view.js does), so the view's process reads and parses the run's
files the whole time; "closed" is `areal run` alone. Both write spans and status.json (they are part of every
run); `--spans-off` adds runs with records.spans=false, which measures what recording spans costs. The order
alternates each round (ABBA), so a machine that gets busier or quieter over the benchmark favours neither arm.
Printed: each run's trained samples/s (from its last step record: startup excluded), each arm's mean and
spread, the ratio of means to "closed", each round's ratio, and the view process's CPU: in all (its start
imports torch and runs the recipe to draw the graph) and as a share of one core once it answers.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ["steps=10", "batch_size=4", "group_size=4", "eval.tasks=8", "eval.interval_steps=0"]
PAGE_RATES_S = {"api/live": 1.0, "api/metrics?since=0": 2.0, "api/samples?limit=50": 5.0}
TICKS = 100  # /proc/PID/stat counts CPU time in clock ticks (USER_HZ)


class PageClient(threading.Thread):
    """Asks what the page asks, at its rates, until the run's process ends; notes the view's CPU seconds."""

    def __init__(self, url: str, view_pid: int, run: subprocess.Popen[str]) -> None:
        super().__init__(daemon=True)
        self.url, self.view_pid, self.run_process = url, view_pid, run
        self.requests = self.failed = 0
        self.view_cpu_s = 0.0
        self.serving: tuple[float, float] | None = None  # (time, view CPU s) at the first answered request
        self.serving_share = 0.0  # of one core, from then to the run's end: the view's cost once started

    def run(self) -> None:
        due = dict.fromkeys(PAGE_RATES_S, 0.0)
        while self.run_process.poll() is None:
            now = time.monotonic()
            for path, every in PAGE_RATES_S.items():
                if now >= due[path]:
                    due[path] = now + every
                    try:
                        urllib.request.urlopen(self.url + path, timeout=10).read()
                        self.requests += 1
                    except OSError:
                        self.failed += 1  # 503 before the plan exists; the view gone at the end
                        continue
                    if self.serving is None:
                        self.serving = (time.monotonic(), _cpu_s(self.view_pid))
            cpu = _cpu_s(self.view_pid)
            if cpu > self.view_cpu_s:
                self.view_cpu_s = cpu
                if self.serving is not None and time.monotonic() > self.serving[0]:
                    self.serving_share = (cpu - self.serving[1]) / (time.monotonic() - self.serving[0])
            time.sleep(0.1)


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def run_once(recipe: Path, arm: str, out: Path, index: int, settings: list[str]) -> dict:
    run_dir = out / f"{index:02d}-{arm}"
    cmd = [sys.executable, "-m", "areal.cli", "run", str(recipe), "-q", "--run-dir", str(run_dir)]
    cmd += [x for s in settings + (["records.spans=false"] if arm == "no spans" else []) for x in ("--set", s)]
    cmd += ["--view", "--view-port", "0"] if arm == "open" else []
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    client = None
    said = []
    for line in process.stdout:
        said.append(line)
        found = re.match(r"view: (http://\S+)\s+\(pid (\d+);", line)
        if found:
            client = PageClient(found.group(1), int(found.group(2)), process)
            client.start()
    if process.wait() != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{''.join(said)[-3000:]}")
    if client is not None:
        client.join(30)
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [s for s in steps if s.get("kind") == "step"][-1]
    return {"arm": arm, "samples_per_s": last["samples_per_s"], "wall_s": last["wall_s"],
            "requests": client.requests if client else 0, "failed": client.failed if client else 0,
            "view_cpu_s": client.view_cpu_s if client else 0.0,
            "serving_share": client.serving_share if client else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "code_rl.py")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spans-off", action="store_true", help="a third arm: records.spans=false")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    arms = ["closed", "open"] + (["no spans"] if args.spans_off else [])
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-view-") as folder:
        for r in range(args.rounds):
            for arm in arms if r % 2 == 0 else arms[::-1]:
                result = run_once(args.recipe, arm, Path(folder), len(results), SETTINGS + args.extra)
                result["round"] = r
                results.append(result)
                print(f"round {r} {arm:>8}: {result['samples_per_s']:.3f} samples/s over {result['wall_s']:.1f} s"
                      + (f"; {result['requests']} page requests ({result['failed']} refused), view CPU "
                         f"{result['view_cpu_s']:.1f} s in all, {result['serving_share']:.1%} of a core while "
                         "serving" if arm == "open" else ""), flush=True)
    report(results, arms)


def report(results: list[dict], arms: list[str]) -> None:
    rate = {arm: [r["samples_per_s"] for r in results if r["arm"] == arm] for arm in arms}
    base = statistics.mean(rate["closed"])
    print("\n| arm | runs | samples/s mean | min..max | stdev | ratio to closed |\n|---|---|---|---|---|---|")
    for arm in arms:
        values = rate[arm]
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"| {arm} | {len(values)} | {statistics.mean(values):.3f} | {min(values):.3f}..{max(values):.3f} "
              f"| {spread:.3f} | {statistics.mean(values) / base:.3f} |")
    rounds = sorted({r["round"] for r in results})
    for arm in arms[1:]:
        ratios = [next(x["samples_per_s"] for x in results if x["round"] == k and x["arm"] == arm)
                  / next(x["samples_per_s"] for x in results if x["round"] == k and x["arm"] == "closed")
                  for k in rounds]
        print(f"{arm} / closed, round by round: {', '.join(f'{x:.3f}' for x in ratios)}")


if __name__ == "__main__":
    main()

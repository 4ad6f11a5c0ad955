"""areal vs TRL's GRPOTrainer: same model, tasks, reward, sampling and machine, one evaluator, in one command.

    python benchmarks/bench_vs_trl.py [--quick] [--seeds 0 1 2] [--samples 8] [--out DIR] [--trl-threads 2]

For each seed, runs TRL (benchmarks/_trl_side.py), then `areal run recipes/code_rl.py` in sync mode, then in
async mode at each --etas staleness bound (1, as the recipe ships, and 2), each as its own process tree for
the same number of trained samples. Neither evaluates while it trains: both save the policy every
`save_interval` steps with the training wall time it was reached at, and afterwards ONE evaluator
(benchmarks/_one_evaluator.py: areal's engine and sandboxed tests, every held-out task, --samples each)
scores every saved version of every side, and the warm start once a seed. So the sides' scores differ by
their weights and the draw alone, each with its standard error. Prints, per seed and over the seeds: trained
samples/s, generated tokens/s, the wall time until a scored version reaches the threshold (the warm start's
pass@1 plus --margin), pass@1 at the start, the middle and the end, the gain, and peak memory of the whole
tree (sum over its processes, sampled every 0.5 s with psutil: RSS, and PSS where /proc lets us read it, RSS
otherwise). Every areal knob the comparison depends on is passed with --set, so recipe defaults may move
without moving the benchmark. Needs `pip install 'areal[bench]'` (TRL). Timings on a shared 2-core machine
are noisy; docs/benchmarks.md says what cannot be made equal.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _one_evaluator import GENERATION, heldout_pass

ROOT = Path(__file__).resolve().parent.parent
ETAS = (1, 2)  # the code_rl recipe ships η = 1; the benchmark's earlier runs used 2
POLL_S = 0.5


@dataclass(frozen=True)
class Pinned:
    """What both sides train with; one optimizer step = batch_size prompts x group_size samples."""

    steps: int
    batch_size: int
    group_size: int
    lr: float
    warmup_steps: int  # linear warmup, then constant
    adam_beta2: float
    save_interval: int  # the policy is saved (for the one evaluator) every so many steps, and at the end


# the code_rl recipe's own learning settings (lr, warmup, β2, batch, steps)
FULL = Pinned(steps=120, batch_size=16, group_size=8, lr=3e-4, warmup_steps=20, adam_beta2=0.99, save_interval=20)
QUICK = Pinned(steps=4, batch_size=4, group_size=4, lr=3e-4, warmup_steps=2, adam_beta2=0.99, save_interval=2)


@dataclass
class Outcome:
    name: str
    trained_samples: int
    samples_per_s: float
    tokens_per_s: float
    saved: list[dict[str, Any]]  # version, wall_s (training time it was reached at), weights (a file)
    peak_rss: int = 0
    peak_pss: int = 0
    notes: list[str] = field(default_factory=list)
    rounds: list[dict[str, Any]] = field(default_factory=list)  # the one evaluator's: version, wall_s, pass@1, se


class TreeMemory:
    """Peak summed memory of a process and all its descendants, polled on a thread."""

    def __init__(self, pid: int) -> None:
        import psutil

        self._psutil = psutil
        self.root = psutil.Process(pid)
        self.peak_rss = 0
        self.peak_pss = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        psutil = self._psutil
        while not self._done.wait(POLL_S):
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            rss = pss = 0
            for proc in procs:
                try:
                    info = proc.memory_info()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                rss += info.rss
                try:
                    pss += proc.memory_full_info().pss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pss += info.rss
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def run_tree(argv: list[str], log: Path) -> TreeMemory:
    """Run argv to completion with its output in `log`; its memory is watched the whole time."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        memory = TreeMemory(proc.pid)
        try:
            code = proc.wait()
        finally:
            memory.stop()
            if proc.poll() is None:  # interrupted: stop it (areal's CLI then stops its workers)
                proc.terminate()
                proc.wait(timeout=60)
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise SystemExit(f"bench_vs_trl: {' '.join(argv[:4])} ... exited with {code}; log {log}:\n{tail}")
    return memory


def run_trl(pinned: Pinned, threads: int, folder: Path, seed: int) -> Outcome:
    spec = {"steps": pinned.steps, "batch_size": pinned.batch_size, "group_size": pinned.group_size,
            "lr": pinned.lr, "warmup_steps": pinned.warmup_steps, "adam_beta2": pinned.adam_beta2,
            "save_interval": pinned.save_interval, "threads": threads, "seed": seed,
            "output_dir": str(folder / "trainer"), "generation": GENERATION}
    (folder / "spec.json").write_text(json.dumps(spec, indent=1) + "\n")
    argv = [sys.executable, str(ROOT / "benchmarks" / "_trl_side.py"), str(folder / "spec.json"),
            str(folder / "result.json")]
    memory = run_tree(argv, folder / "log.txt")
    result = json.loads((folder / "result.json").read_text())
    end = result["step_times"][-1]
    notes = [f"{result['sandbox_errors']} samples scored 0 on a sandbox error"] if result["sandbox_errors"] else []
    return Outcome(f"TRL {_trl_version()}", result["trained_samples"], result["trained_samples"] / end,
                   result["train_tokens"] / end, result["saved"], memory.peak_rss, memory.peak_pss, notes)


def areal_overrides(pinned: Pinned, mode: str, seed: int = 0, eta: int = 1) -> list[str]:
    values: dict[str, Any] = {
        "model": "builtin:tiny-coder", "seed": seed, "data.seed": seed, "steps": pinned.steps, "mode": mode,
        "staleness": eta, "batch_size": pinned.batch_size, "group_size": pinned.group_size,
        "trainer.lr": pinned.lr, "trainer.objective": "decoupled", "trainer.clip_eps": 0.2, "trainer.minibatches": 1,
        "trainer.lr_schedule": "constant", "trainer.warmup_steps": pinned.warmup_steps,
        "trainer.adam_betas": [0.9, pinned.adam_beta2], "trainer.weight_decay": 0.0,
        "trainer.grad_clip": 1.0, "trainer.threads": 1, "generation.threads": 1,
        "eval.interval_steps": 0, "eval.tasks": 0,  # the one evaluator scores the saved versions afterwards
        "checkpoint.interval_steps": pinned.save_interval, "checkpoint.keep": pinned.steps, "max_minutes": None,
        **{f"generation.{k}": v for k, v in GENERATION.items()},
    }
    return [part for key, value in values.items() for part in ("--set", f"{key}={json.dumps(value)}")]


def run_areal(pinned: Pinned, mode: str, folder: Path, seed: int, eta: int = 1) -> Outcome:
    run_dir = folder / "run"
    argv = [sys.executable, "-m", "areal.cli", "run", str(ROOT / "recipes" / "code_rl.py"), "--run-dir",
            str(run_dir), "-q", *areal_overrides(pinned, mode, seed, eta)]
    memory = run_tree(argv, folder / "log.txt")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = {r["version"]: r for r in records if r.get("kind") == "step"}
    saved = [{"version": v, "wall_s": steps[v]["wall_s"],
              "weights": str(run_dir / "checkpoints" / f"step-{v:06d}" / "policy-actor.safetensors")}
             for v in sorted(steps) if v % pinned.save_interval == 0 or v == pinned.steps]
    last = steps[max(steps)]
    name = "areal sync" if mode == "sync" else f"areal async η={eta}"
    return Outcome(name, int(last["trained_samples"]), float(last["samples_per_s"]),
                   float(last["generated_tokens_per_s"]), saved, memory.peak_rss, memory.peak_pss)


def score(outcome: Outcome, start: dict[str, Any], samples: int, seed: int) -> None:
    """The one evaluator's rounds for every version the side saved, after the warm start's (version 0)."""
    outcome.rounds = [{"version": 0, "wall_s": 0.0, "pass@1": start["pass@1"], "se": start["pass@1_se"]}]
    for saved in outcome.saved:
        result = heldout_pass(Path(saved["weights"]), samples, seed, GENERATION)
        outcome.rounds.append({"version": saved["version"], "wall_s": saved["wall_s"], "pass@1": result["pass@1"],
                               "se": result["pass@1_se"]})


def _trl_version() -> str:
    from importlib.metadata import version

    return version("trl")


def time_to(rounds: list[dict[str, Any]], threshold: float) -> float | None:
    return next((r["wall_s"] for r in sorted(rounds, key=lambda r: r["wall_s"]) if r["pass@1"] >= threshold), None)


def warm_pass(rounds: list[dict[str, Any]]) -> float | None:
    return next((r["pass@1"] for r in rounds if r["version"] == 0), None)


def final_pass(rounds: list[dict[str, Any]]) -> float:
    return max(rounds, key=lambda r: (r["version"], r["wall_s"]))["pass@1"]


def middle_pass(rounds: list[dict[str, Any]]) -> float | None:
    """pass@1 of the version saved half-way through (the last at or before it)."""
    half = max(r["version"] for r in rounds) // 2
    before = [r for r in rounds if 0 < r["version"] <= half]
    return max(before, key=lambda r: r["version"])["pass@1"] if before else None


def gain(rounds: list[dict[str, Any]]) -> tuple[float, float]:
    """Final minus warm-start pass@1, and the standard error of that difference (two independent draws)."""
    first, last = rounds[0], max(rounds, key=lambda r: r["version"])
    return last["pass@1"] - first["pass@1"], math.hypot(first["se"], last["se"])


def _grid(head: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, body)]


def table(outcomes: list[Outcome], threshold: float) -> str:
    """One seed's runs, side by side, with each areal side's ratio to TRL."""
    rows: list[tuple[str, list[float | None], str]] = [
        ("trained samples/s", [o.samples_per_s for o in outcomes], "{:.1f}"),
        ("generated tokens/s", [o.tokens_per_s for o in outcomes], "{:.0f}"),
        (f"wall s to pass@1 >= {threshold:.3f}", [time_to(o.rounds, threshold) for o in outcomes], "{:.1f}"),
        ("warm-start held-out pass@1 (v0)", [warm_pass(o.rounds) for o in outcomes], "{:.3f}"),
        ("middle held-out pass@1", [middle_pass(o.rounds) for o in outcomes], "{:.3f}"),
        ("final held-out pass@1", [final_pass(o.rounds) for o in outcomes], "{:.3f}"),
        ("peak RSS, tree sum (MiB)", [o.peak_rss / 2**20 for o in outcomes], "{:.0f}"),
        ("peak PSS, tree sum (MiB)", [o.peak_pss / 2**20 for o in outcomes], "{:.0f}"),
    ]
    head = ["", *(o.name for o in outcomes), *(f"{o.name.split(' ', 1)[1]} / TRL" for o in outcomes[1:])]
    body = []
    for label, values, fmt in rows:
        cells = [fmt.format(v) if v is not None else "not reached" for v in values]
        ratios = [f"{v / values[0]:.2f}x" if v is not None and values[0] else "-" for v in values[1:]]
        body.append([label, *cells, *ratios])
    out = _grid(head, body)
    out.append(f"trained samples: {', '.join(f'{o.name} {o.trained_samples}' for o in outcomes)}")
    for o in outcomes:
        curve = " ".join(f"v{r['version']}:{r['pass@1']:.3f}±{r['se']:.3f}@{r['wall_s']:.0f}s" for r in o.rounds)
        out.append(f"{o.name} held-out pass@1 (one evaluator): {curve}")
        out.extend(f"{o.name}: {n}" for n in o.notes)
    return "\n".join(out)


def _mean_se(values: list[float]) -> tuple[float, float]:
    """The mean and its standard error over seeds (nan with one seed)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, math.nan
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))


def summary(by_seed: list[list[Outcome]], margin: float) -> str:
    """Every side over the seeds: mean ± standard error; the gain is final minus warm start in points."""
    names = [o.name for o in by_seed[0]]
    body = []
    for i, name in enumerate(names):
        runs = [outcomes[i] for outcomes in by_seed]
        rate, rate_se = _mean_se([o.samples_per_s for o in runs])
        gains = [100 * gain(o.rounds)[0] for o in runs]
        g, g_se = _mean_se(gains)
        draw = 100 * math.sqrt(sum(gain(o.rounds)[1] ** 2 for o in runs)) / len(runs)  # the evaluator's share
        trl_gains = [100 * gain(outcomes[0].rounds)[0] for outcomes in by_seed]
        diff, diff_se = _mean_se([a - b for a, b in zip(gains, trl_gains)])
        reached = [time_to(o.rounds, o.rounds[0]["pass@1"] + margin) for o in runs]
        times = [t for t in reached if t is not None]
        final, final_se = _mean_se([100 * final_pass(o.rounds) for o in runs])
        body.append([name, f"{rate:.1f} ± {rate_se:.1f}", f"{final:.1f} ± {final_se:.1f}",
                     f"{g:+.1f} ± {g_se:.1f} (draw ± {draw:.1f})",
                     "-" if i == 0 else f"{diff:+.1f} ± {diff_se:.1f}",
                     f"{sum(times) / len(times):.0f} ({len(times)}/{len(runs)})" if times
                     else f"not reached (0/{len(runs)})"])
    head = ["", "trained samples/s", "final pass@1 (points)", "gain (points)", "gain − TRL's",
            f"wall s to warm start + {100 * margin:.0f} points (seeds reached)"]
    return "\n".join([f"over {len(by_seed)} seeds (mean ± standard error over seeds; 'draw' is the evaluator's own "
                       "standard error of the gain):", *_grid(head, body)])


def finished(path: Path, etas: list[int]) -> list[Outcome] | None:
    """The outcomes a finished seed left under --out, if its arms are this invocation's (else an error)."""
    if not path.exists():
        return None
    outcomes = [Outcome(**o) for o in json.loads(path.read_text())]
    arms = [o.name for o in outcomes[1:]]
    wanted = ["areal sync", *(f"areal async η={eta}" for eta in etas)]
    if arms != wanted:
        raise SystemExit(f"{path} holds the arms {arms}, this run asks for {wanted}: give another --out, or the "
                         f"--etas it ran with")
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke configuration (a few minutes)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--etas", type=int, nargs="+", default=list(ETAS), help="the async arms' staleness bounds")
    parser.add_argument("--samples", type=int, default=8, help="the one evaluator's samples of each held-out task")
    parser.add_argument("--out", type=Path, help="folder for the runs (default: a new temp folder); a seed finished "
                        "there already is read back, not run again")
    parser.add_argument("--trl-threads", type=int, default=2, help="torch threads of the TRL process")
    parser.add_argument("--margin", type=float, default=0.10, help="threshold = warm-start pass@1 + margin")
    args = parser.parse_args()
    pinned = QUICK if args.quick else FULL
    samples = 1 if args.quick else args.samples
    root = args.out or Path(tempfile.mkdtemp(prefix="bench_vs_trl-"))
    import torch

    print(f"bench_vs_trl: {pinned}, generation {GENERATION}, seeds {args.seeds}, {samples} evaluator samples a "
          f"task, TRL threads {args.trl_threads}, torch {torch.__version__}, {os.cpu_count()} cores; runs under "
          f"{root}", flush=True)
    by_seed = []
    for seed in args.seeds:
        done = finished(root / f"seed-{seed}" / "outcomes.json", args.etas)
        if done is not None:  # a seed an earlier invocation finished under --out: read, not run again
            print(f"seed {seed}: read from {root / f'seed-{seed}' / 'outcomes.json'}", flush=True)
            by_seed.append(done)
            continue
        warm = heldout_pass(None, samples, seed, GENERATION)
        print(f"seed {seed}: warm start {warm['pass@1']:.3f} ± {warm['pass@1_se']:.3f} "
              f"({warm['seconds']:.0f} s to score)", flush=True)
        outcomes = []
        for name in ("trl", "areal-sync", *(f"areal-async-{eta}" for eta in args.etas)):
            folder = root / f"seed-{seed}" / name
            folder.mkdir(parents=True, exist_ok=True)
            start = time.monotonic()
            if name == "trl":
                outcomes.append(run_trl(pinned, args.trl_threads, folder, seed))
            elif name == "areal-sync":
                outcomes.append(run_areal(pinned, "sync", folder, seed))
            else:
                outcomes.append(run_areal(pinned, "async", folder, seed, int(name.rsplit("-", 1)[1])))
            print(f"  {name}: done in {time.monotonic() - start:.0f} s (with startup)", flush=True)
        for outcome in outcomes:
            score(outcome, warm, samples, seed)
        (root / f"seed-{seed}" / "outcomes.json").write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
        print(table(outcomes, warm["pass@1"] + args.margin), flush=True)
        by_seed.append(outcomes)
    print(summary(by_seed, args.margin))


if __name__ == "__main__":
    main()

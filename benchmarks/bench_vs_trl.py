"""areal vs TRL's GRPOTrainer: same model, tasks, reward, sampling and machine, in one command.

    python benchmarks/bench_vs_trl.py [--quick] [--out DIR] [--trl-threads 2]

Runs TRL (benchmarks/_trl_side.py), then `areal run recipes/code_rl.py` in sync mode, then in
async mode (staleness 2), each as its own process tree for the same number of trained samples,
and prints one table with areal/TRL ratios: trained samples/s, generated tokens/s, wall-clock
until a held-out pass@1 round reaches the threshold (the mean of the three warm-start rounds
plus --margin, the same for all), the final held-out pass@1, and peak memory of the whole tree
(sum over its processes, sampled every 0.5 s with psutil: RSS, and PSS where /proc lets us read
it, RSS otherwise). Every areal knob the comparison depends on is passed with --set, so recipe
defaults may move without moving the benchmark. Needs `pip install 'areal[bench]'` (TRL).
Timings on a shared 2-core machine are noisy; docs/benchmarks.md says what cannot be made equal.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GENERATION = {"max_new_tokens": 48, "temperature": 1.0, "top_p": 1.0, "stop": ["\ndef ", "\n#", "\nprint", "\n\n"]}
SEED = 0
STALENESS = 2
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
    eval_interval: int
    eval_tasks: int


# the code_rl recipe's own learning settings (lr, warmup, β2, batch, steps)
FULL = Pinned(steps=120, batch_size=16, group_size=8, lr=3e-4, warmup_steps=20, adam_beta2=0.99, eval_interval=20,
              eval_tasks=128)
QUICK = Pinned(steps=4, batch_size=4, group_size=4, lr=3e-4, warmup_steps=2, adam_beta2=0.99, eval_interval=2,
               eval_tasks=16)


@dataclass
class Outcome:
    name: str
    trained_samples: int
    samples_per_s: float
    tokens_per_s: float
    rounds: list[dict[str, Any]]  # eval rounds: version, wall_s (when the score was known), pass@1
    peak_rss: int = 0
    peak_pss: int = 0
    notes: list[str] = field(default_factory=list)


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


def run_trl(pinned: Pinned, threads: int, folder: Path) -> Outcome:
    spec = {"steps": pinned.steps, "batch_size": pinned.batch_size, "group_size": pinned.group_size,
            "lr": pinned.lr, "warmup_steps": pinned.warmup_steps, "adam_beta2": pinned.adam_beta2,
            "eval_interval": pinned.eval_interval, "eval_tasks": pinned.eval_tasks,
            "threads": threads, "seed": SEED, "output_dir": str(folder / "trainer"), "generation": GENERATION}
    (folder / "spec.json").write_text(json.dumps(spec, indent=1) + "\n")
    argv = [sys.executable, str(ROOT / "benchmarks" / "_trl_side.py"), str(folder / "spec.json"),
            str(folder / "result.json")]
    memory = run_tree(argv, folder / "log.txt")
    result = json.loads((folder / "result.json").read_text())
    end = result["step_times"][-1]
    before_end = [r for r in result["rounds"] if r["wall_s"] <= end]
    eval_s = sum(r["eval_s"] for r in before_end)
    notes = [f"held-out evaluation inside the training loop: {eval_s:.1f} s of the {end:.1f} s to the last step"]
    if result["sandbox_errors"]:
        notes.append(f"{result['sandbox_errors']} samples scored 0 on a sandbox error")
    tokens = result["train_tokens"] + sum(r["tokens"] for r in before_end)
    return Outcome(f"TRL {_trl_version()}", result["trained_samples"], result["trained_samples"] / end, tokens / end,
                   result["rounds"], memory.peak_rss, memory.peak_pss, notes)


def areal_overrides(pinned: Pinned, mode: str) -> list[str]:
    values: dict[str, Any] = {
        "model": "builtin:tiny-coder", "seed": SEED, "data.seed": SEED, "steps": pinned.steps, "mode": mode,
        "staleness": STALENESS, "batch_size": pinned.batch_size, "group_size": pinned.group_size,
        "trainer.lr": pinned.lr, "trainer.objective": "decoupled", "trainer.clip_eps": 0.2, "trainer.minibatches": 1,
        "trainer.lr_schedule": "constant", "trainer.warmup_steps": pinned.warmup_steps,
        "trainer.adam_betas": [0.9, pinned.adam_beta2], "trainer.weight_decay": 0.0,
        "trainer.grad_clip": 1.0, "trainer.threads": 1, "generation.threads": 1,
        "eval.interval_steps": pinned.eval_interval, "eval.tasks": pinned.eval_tasks, "eval.samples": 1,
        "checkpoint.interval_steps": 0, "max_minutes": None,
        **{f"generation.{k}": v for k, v in GENERATION.items()},
    }
    return [part for key, value in values.items() for part in ("--set", f"{key}={json.dumps(value)}")]


def run_areal(pinned: Pinned, mode: str, folder: Path) -> Outcome:
    run_dir = folder / "run"
    cli = Path(sys.executable).with_name("areal")
    argv = [str(cli), "run", str(ROOT / "recipes" / "code_rl.py"), "--run-dir", str(run_dir), "-q",
            *areal_overrides(pinned, mode)]
    memory = run_tree(argv, folder / "log.txt")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in records if r.get("kind") == "step"]
    rounds = [{"version": r["version"], "wall_s": r["wall_s"], "pass@1": r["pass@1"]}
              for r in records if r.get("kind") == "eval"]
    last = steps[-1]
    name = "areal sync" if mode == "sync" else f"areal async η={STALENESS}"
    return Outcome(name, int(last["trained_samples"]), float(last["samples_per_s"]),
                   float(last["generated_tokens_per_s"]), rounds, memory.peak_rss, memory.peak_pss)


def _trl_version() -> str:
    from importlib.metadata import version

    return version("trl")


def time_to(rounds: list[dict[str, Any]], threshold: float) -> float | None:
    return next((r["wall_s"] for r in sorted(rounds, key=lambda r: r["wall_s"]) if r["pass@1"] >= threshold), None)


def warm_pass(rounds: list[dict[str, Any]]) -> float | None:
    return next((r["pass@1"] for r in rounds if r["version"] == 0), None)


def final_pass(rounds: list[dict[str, Any]]) -> float:
    return max(rounds, key=lambda r: (r["version"], r["wall_s"]))["pass@1"]


def table(outcomes: list[Outcome], threshold: float) -> str:
    rows: list[tuple[str, list[float | None], str]] = [
        ("trained samples/s", [o.samples_per_s for o in outcomes], "{:.1f}"),
        ("generated tokens/s", [o.tokens_per_s for o in outcomes], "{:.0f}"),
        (f"wall s to pass@1 >= {threshold:.3f}", [time_to(o.rounds, threshold) for o in outcomes], "{:.1f}"),
        ("warm-start held-out pass@1 (v0)", [warm_pass(o.rounds) for o in outcomes], "{:.3f}"),
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
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    out = [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, body)]
    out.append(f"trained samples: {', '.join(f'{o.name} {o.trained_samples}' for o in outcomes)}")
    for o in outcomes:
        curve = " ".join(f"v{r['version']}:{r['pass@1']:.3f}@{r['wall_s']:.0f}s" for r in o.rounds)
        out.append(f"{o.name} held-out pass@1: {curve}")
        out.extend(f"{o.name}: {n}" for n in o.notes)
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke configuration (a minute or two)")
    parser.add_argument("--out", type=Path, help="folder for the three runs (default: a new temp folder)")
    parser.add_argument("--trl-threads", type=int, default=2, help="torch threads of the TRL process")
    parser.add_argument("--margin", type=float, default=0.10, help="threshold = mean warm-start pass@1 + margin")
    args = parser.parse_args()
    pinned = QUICK if args.quick else FULL
    root = args.out or Path(tempfile.mkdtemp(prefix="bench_vs_trl-"))
    import torch

    print(f"bench_vs_trl: {pinned}, generation {GENERATION}, TRL threads {args.trl_threads}, "
          f"torch {torch.__version__}, {os.cpu_count()} cores; runs under {root}", flush=True)
    outcomes = []
    for name, job in (("trl", lambda f: run_trl(pinned, args.trl_threads, f)),
                      ("areal-sync", lambda f: run_areal(pinned, "sync", f)),
                      ("areal-async", lambda f: run_areal(pinned, "async", f))):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        outcomes.append(job(folder))
        print(f"  {name}: done in {time.monotonic() - start:.0f} s (with startup)", flush=True)
    warm = [w for w in (warm_pass(o.rounds) for o in outcomes) if w is not None]
    threshold = sum(warm) / len(warm) + args.margin
    print(table(outcomes, threshold))


if __name__ == "__main__":
    main()

"""The runtime's own overlap and scaling, on emulated devices (recipes/emulated_rl.py: no model, modelled time).

    python benchmarks/bench_scale.py                        # all three tables and the memory line
    python benchmarks/bench_scale.py --tables overlap --steps 6 --generators 1 2   # a smoke run

- **overlap**: sync vs async at η = 1, 2, 4, 8 with one generator and one trainer, the generator
  decoding one batch at a time in both modes and the trainer's per-token time scaled up so that
  training is as long as generation. The ideal is computed from the sync run's own phase times:
  T_train the trainer's time per step, T_gen the rest of the step; perfect overlap runs a step in
  max(T_gen, T_train) instead of their sum.
- **scaling**: 1..32 generator replicas, the batch proportional (B = 2 groups per generator),
  async η = 2; the trainer stands for as many GPUs as there are generators (its per-token time is
  divided by them), so the line is the runtime's, not one trainer's. Trained samples/s against N×
  the one-generator rate, the controller's CPU seconds per trained sample, its control messages
  per second, RSS / PSS of the worker processes (from /proc/PID/smaps_rollup, read once the
  run has started stepping), and how busy the machine's cores were from the first step on (/proc/stat).
- **tails**: the same run with output lengths of little and of much spread (log-normal σ), sync vs
  async η = 2: a synchronous step waits for its batch's longest output.

Each run is `build_controller(...).run()` in this process (its workers are real processes). The
modelled clock runs `--time-scale` real seconds per modelled second. Workers start before the
clock: samples/s counts from the first step on (startup is reported apart by the runtime).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "emulated_rl.py"
PROFILES = ROOT / "areal" / "engines" / "profiles"
GROUP = 8


def run(overrides: list[str], run_dir: Path, on_started: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """One emulated run; what the tables need from its step records (after the first, which pays warm-up)."""
    from areal.runtime.launch import build_controller

    sampled: list[bool] = []
    cpu_at_first_step: list[tuple[int, int]] = []  # the machine's CPU counters once the workers have started

    def event(controller: Any) -> None:
        if not cpu_at_first_step and controller.state.version >= 1:
            cpu_at_first_step.append(_machine_cpu())
        if on_started is not None and not sampled and controller.state.version >= 2:
            sampled.append(True)
            on_started(controller)

    controller = build_controller(RECIPE, overrides, run_dir, on_event=event)
    started = time.monotonic()
    controller.run()
    busy, total = (after - before for after, before in zip(_machine_cpu(), cpu_at_first_step[0], strict=True))
    steps = [r for r in _lines(run_dir) if r["kind"] == "step"]
    first, last = steps[0], steps[-1]
    trained = last["trained_samples"] - first["trained_samples"]
    span = last["wall_s"] - first["wall_s"]
    walls = [s["wall_s"] for s in steps]
    return {
        "samples_per_s": trained / span,
        "t_step": statistics.median(b - a for a, b in zip(walls, walls[1:])),
        "t_train": statistics.median(s["update_s"] + s["prox_s"] for s in steps[1:]),
        "controller_cpu_per_sample": (last["controller_cpu_s"] - first["controller_cpu_s"]) / trained,
        "messages_per_s": (last["control_messages"] - first["control_messages"]) / span,
        "wall_s": time.monotonic() - started,
        "machine_busy": busy / total if total else 0.0,  # of all cores, from the first step to the end
    }


def _machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot, from /proc/stat: is the machine itself the limit?"""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle and iowait
    return sum(values) - idle, sum(values)


def _lines(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def memory_of(controller: Any) -> dict[str, float]:
    """Mean RSS and PSS (MiB) of the run's worker processes, from /proc/PID/smaps_rollup."""
    rss, pss = [], []
    for worker in controller.workers.values():
        fields = _smaps(worker.process.pid)
        if fields:
            rss.append(fields["Rss"] / 1024)
            pss.append(fields["Pss"] / 1024)
    return {"workers": len(rss), "rss_mib": statistics.mean(rss) if rss else 0.0,
            "pss_mib": statistics.mean(pss) if pss else 0.0}


def _smaps(pid: int) -> dict[str, int]:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines()[1:]:
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            out[key] = int(value.split()[0])
    return out


def base(args: argparse.Namespace) -> list[str]:
    return [f"steps={args.steps}", f"group_size={GROUP}", f"emulation.time_scale={args.time_scale}",
            f"emulation.output_tokens_median={args.median}", "checkpoint.interval_steps=0"]


def overlap(args: argparse.Namespace, tmp: Path) -> list[str]:
    """Overlap alone: the generator decodes at most one batch at once (max_batch = B·G) in both modes, so
    async cannot gain by decoding more sequences per step, and the trainer's per-token time is scaled so
    that T_train is comparable to T_gen (the profile's 1.5B update is ~10x shorter than its generation)."""
    profile = json.loads((PROFILES / "h100-qwen2.5-1.5b.json").read_text())
    profile["train_per_token_s"] *= args.train_scale
    (tmp / "overlap.json").write_text(json.dumps(profile))
    same = [*base(args), "batch_size=4", f"generation.max_batch={4 * GROUP}",
            f"emulation.profile={tmp / 'overlap.json'}"]
    rows = []
    sync = run([*same, "mode=sync"], tmp / "overlap-sync")
    t_gen = sync["t_step"] - sync["t_train"]
    ideal = (t_gen + sync["t_train"]) / max(t_gen, sync["t_train"])
    rows.append(("sync η=0", sync, 1.0))
    for eta in args.etas:
        result = run([*same, f"staleness={eta}"], tmp / f"overlap-eta{eta}")
        rows.append((f"async η={eta}", result, result["samples_per_s"] / sync["samples_per_s"]))
    lines = [f"one generator (max_batch = one batch), one trainer (train_per_token_s x{args.train_scale:g}), B = 4 "
             f"groups of {GROUP}; sync phases: T_gen {t_gen:.2f} s, T_train {sync['t_train']:.2f} s (real), "
             f"ideal overlap {ideal:.2f}x", "",
             f"{'mode':<12} {'samples/s':>10} {'vs sync':>8} {'of ideal':>9}"]
    lines += [f"{name:<12} {r['samples_per_s']:>10.2f} {speedup:>7.2f}x {speedup / ideal:>8.0%}"
              for name, r, speedup in rows]
    return lines


def scaling(args: argparse.Namespace, tmp: Path) -> list[str]:
    lines = [f"{'generators':>10} {'samples/s':>10} {'ideal':>8} {'of ideal':>9} {'ctl CPU ms/sample':>18} "
             f"{'ctl msgs/s':>11} {'worker RSS MiB':>15} {'PSS MiB':>8} {'CPU busy':>9}"]
    one = None
    for n in args.generators:
        memory: dict[str, float] = {}
        placement = f'placement={{"rollout": {n}, "score": {max(1, n // 4)}}}'  # a reward replica per 4 generators
        result = run([*base(args), f"batch_size={2 * n}", placement, f"emulation.trainer_gpus_per_rank={n}",
                      f"emulation.output_tokens_sigma={args.sigma}"],
                     tmp / f"scale-{n}", on_started=lambda c, into=memory: into.update(memory_of(c)))
        one = one or result["samples_per_s"] / n
        ideal = one * n
        lines.append(f"{n:>10} {result['samples_per_s']:>10.2f} {ideal:>8.2f} {result['samples_per_s'] / ideal:>8.0%} "
                     f"{1000 * result['controller_cpu_per_sample']:>18.3f} {result['messages_per_s']:>11.1f} "
                     f"{memory.get('rss_mib', 0):>15.0f} {memory.get('pss_mib', 0):>8.0f} "
                     f"{result['machine_busy']:>8.0%}")
    return lines


def tails(args: argparse.Namespace, tmp: Path) -> list[str]:
    lines = [f"{'σ of log-lengths':>16} {'sync samples/s':>15} {'async η=2':>10} {'async / sync':>13}"]
    for sigma in (0.2, 1.0):
        spread = [*base(args), "batch_size=4", f"emulation.output_tokens_sigma={sigma}"]
        sync = run([*spread, "mode=sync"], tmp / f"tail-{sigma}-sync")
        asynchronous = run([*spread, "staleness=2"], tmp / f"tail-{sigma}-async")
        lines.append(f"{sigma:>16} {sync['samples_per_s']:>15.2f} {asynchronous['samples_per_s']:>10.2f} "
                     f"{asynchronous['samples_per_s'] / sync['samples_per_s']:>12.2f}x")
    return lines


TABLES = {"overlap": overlap, "scaling": scaling, "tails": tails}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", nargs="+", choices=list(TABLES), default=list(TABLES))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--time-scale", type=float, default=0.1, help="real seconds per modelled second")
    parser.add_argument("--median", type=int, default=1024, help="median output tokens")
    parser.add_argument("--etas", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--sigma", type=float, default=0.6, help="scaling table: σ of the log-normal output lengths")
    parser.add_argument("--train-scale", type=float, default=10.0,
                        help="overlap table: the trainer's per-token time x this, so training is as long as generation")
    parser.add_argument("--generators", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="areal-bench-scale-") as tmp:
        for name in args.tables:
            print(f"running {name} ...", file=sys.stderr, flush=True)
            lines = TABLES[name](args, Path(tmp))
            print(f"\n## {name}\n" + "\n".join(lines), flush=True)


if __name__ == "__main__":
    main()

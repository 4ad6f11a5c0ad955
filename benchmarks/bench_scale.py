"""The runtime's own overlap and scaling, on emulated devices (recipes/emulated_rl.py: no model, modelled time).

    python benchmarks/bench_scale.py                        # every table
    python benchmarks/bench_scale.py --tables overlap --steps 6 --generators 1 2   # a smoke run

- **overlap**: sync vs async at η = 1, 2, 4, 8 with one generator and one trainer, the generator
  decoding one batch at a time in both modes and the trainer's per-token time scaled up so that
  training is as long as generation. The ideal is computed from the sync run's own phase times:
  T_train the trainer's time per step, T_gen the rest of the step; perfect overlap runs a step in
  max(T_gen, T_train) instead of their sum.
- **scaling**: 1..32 generator replicas, the batch proportional (B = 2 groups per generator),
  async η = 2; the trainer stands for as many GPUs as there are generators (its per-token time is
  divided by them), so the line is the runtime's, not one trainer's. Run at `--scaling-time-scale`
  (1: real time, so this machine's cores are not what limits 32 generators). Trained samples/s
  against two lines: N x the one-generator rate, and the rate of the same run with no runtime
  overhead at all (`scale_model.py`: the gate, round-robin dealing, continuous batching and
  in-order training replayed on the same profile, prompts and output lengths). Then the costs: the
  controller's CPU per trained sample and its control messages per second, each pool's CPU per
  trained sample (/proc/PID/stat, from the first step to the last), and RSS / PSS of the worker
  processes (/proc/PID/smaps_rollup, read once the run has started stepping).
- **ideal**: the zero-overhead model alone, up to 256 generators and for η = 2, 4, 8: how much of
  N x one generator a hard staleness bound leaves when the longest of B·G outputs sets each step.
- **ranks**: the scaling run at 8 generators, its 8 trainer GPUs split over 1, 2, 4, 8 trainer
  processes (`trainer.ranks`): what data-parallel ranks cost, against the same model.
- **tails**: the same run with output lengths of little and of much spread (log-normal σ), sync vs
  async η = 2: a synchronous step waits for its batch's longest output.

Each run is `build_controller(...).run()` in this process (its workers are real processes). The
modelled clock runs `--time-scale` real seconds per modelled second. Workers start before the
clock: samples/s counts from the first step on (startup is reported apart by the runtime).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import scale_model
from bench_worker_memory import smaps_rollup

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "emulated_rl.py"
PROFILES = ROOT / "areal" / "engines" / "profiles"
GROUP = 8


def run(overrides: list[str], run_dir: Path, on_started: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """One emulated run; what the tables need from its step records (after the first, which pays warm-up)."""
    from areal.cli.run import build_controller

    sampled: list[bool] = []
    cpu_at_first_step: list[tuple[int, int]] = []  # the machine's CPU counters once the workers have started
    pool_cpu: dict[int, dict[str, float]] = {}  # version -> CPU seconds of each pool's processes when it landed

    def event(controller: Any) -> None:
        version = controller.state.version
        if not cpu_at_first_step and version >= 1:
            cpu_at_first_step.append(_machine_cpu())
        if version >= 1 and version not in pool_cpu:
            pool_cpu[version] = _pool_cpu(controller)
        if on_started is not None and not sampled and version >= 2:
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
    cpu_first, cpu_last = pool_cpu[min(pool_cpu)], pool_cpu[max(pool_cpu)]
    return {
        "samples_per_s": trained / span,
        "t_step": statistics.median(b - a for a, b in zip(walls, walls[1:])),
        "t_train": statistics.median(s["update_s"] + s["prox_s"] for s in steps[1:]),
        "controller_cpu_per_sample": (last["controller_cpu_s"] - first["controller_cpu_s"]) / trained,
        "messages_per_s": (last["control_messages"] - first["control_messages"]) / span,
        "pool_cpu_per_sample": {pool: (cpu_last.get(pool, 0.0) - cpu_first.get(pool, 0.0)) / trained
                                for pool in cpu_first},
        "wall_s": time.monotonic() - started,
        "machine_busy": busy / total if total else 0.0,  # of all cores, from the first step to the end
        "steps": steps,
    }


def _pool_cpu(controller: Any) -> dict[str, float]:
    """CPU seconds (user + system) each pool's worker processes have used so far, from /proc/PID/stat."""
    seconds: dict[str, float] = {}
    for worker in controller.workers.values():
        try:
            stat = Path(f"/proc/{worker.process.pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        used = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
        seconds[worker.pool] = seconds.get(worker.pool, 0.0) + used
    return seconds


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
        fields = smaps_rollup(worker.process.pid)
        if fields:
            rss.append(fields["Rss"] / 1024)
            pss.append(fields["Pss"] / 1024)
    return {"workers": len(rss), "rss_mib": statistics.mean(rss) if rss else 0.0,
            "pss_mib": statistics.mean(pss) if pss else 0.0}


def base(args: argparse.Namespace, time_scale: float | None = None) -> list[str]:
    scale = args.time_scale if time_scale is None else time_scale
    return [f"steps={args.steps}", f"group_size={GROUP}", f"emulation.time_scale={scale}",
            f"emulation.output_tokens_median={args.median}", "checkpoint.interval_steps=0", *args.set]


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


def weak_scaling(args: argparse.Namespace, generators: int, *more: str) -> list[str]:
    """The overrides of a weak-scaling run: B = 2 groups per generator, a reward replica per 4 generators."""
    return [*base(args, args.scaling_time_scale), f"batch_size={2 * generators}",
            f'placement={{"rollout": {generators}, "score": {max(1, generators // 4)}}}',
            f"emulation.output_tokens_sigma={args.sigma}", *more]


def scaling(args: argparse.Namespace, tmp: Path) -> list[str]:
    """Measured weak scaling beside N x one generator and beside the zero-overhead model of the same runs."""
    rates = [f"{'generators':>10} {'samples/s':>10} {'N x one':>8} {'of N x one':>11} {'model':>8} {'of model':>9} "
             f"{'CPU busy':>9}"]
    costs: list[str] = []
    one = None
    for n in args.generators:
        memory: dict[str, float] = {}
        overrides = weak_scaling(args, n, f"emulation.trainer_gpus_per_rank={n}")
        result = run(overrides, tmp / f"scale-{n}", on_started=lambda c, into=memory: into.update(memory_of(c)))
        modelled = modelled_rate(overrides, generators=n)
        rate = result["samples_per_s"]
        one = one or rate / n
        rates.append(f"{n:>10} {rate:>10.2f} {one * n:>8.2f} {rate / (one * n):>10.0%} {modelled:>8.2f} "
                     f"{rate / modelled:>8.0%} {result['machine_busy']:>8.0%}")
        pools = sorted(result["pool_cpu_per_sample"])
        if not costs:
            costs = [f"{'generators':>10} {'ctl CPU ms/sample':>18} {'ctl msgs/s':>11} "
                     + " ".join(f"{pool + ' CPU ms/sample':>22}" for pool in pools)
                     + f" {'worker RSS MiB':>15} {'PSS MiB':>8}"]
        costs.append(f"{n:>10} {1000 * result['controller_cpu_per_sample']:>18.3f} {result['messages_per_s']:>11.1f} "
                     + " ".join(f"{1000 * result['pool_cpu_per_sample'][pool]:>22.2f}" for pool in pools)
                     + f" {memory.get('rss_mib', 0):>15.0f} {memory.get('pss_mib', 0):>8.0f}")
    return [*rates, "", *costs]


def modelled_rate(overrides: list[str], generators: int) -> float:
    """Trained samples per real second of a runtime with no overhead (benchmarks/scale_model.py), for the run these
    overrides make: the same recipe, profile, prompts and output lengths."""
    return modelled(overrides, generators)[0]


def modelled(overrides: list[str], generators: int, policy: str | None = None) -> tuple[float, scale_model.Outcome]:
    """`modelled_rate`, and what the model measured besides (lags, stale, masked and dropped tokens, lengths);
    `policy` to model another policy than the config's."""
    from areal.engines.emulated.device import DeviceProfile, OutputLengths
    from areal.engines.emulated.generate import QUANTUM_S

    config, prompts = recipe_settings(overrides)
    e = config.emulation
    schedule = scale_model.Schedule(
        DeviceProfile.load(e.profile), OutputLengths(e.output_tokens_median, e.output_tokens_sigma, config.seed),
        prompts, generators, config.batch_size, config.group_size, config.staleness, config.steps,
        max_batch=config.generation.max_batch, max_new_tokens=config.generation.max_new_tokens,
        trainer_gpus=e.trainer_gpus_per_rank * config.trainer.ranks,
        quantum_s=QUANTUM_S / e.time_scale if e.time_scale > 0 else float("inf"),
        policy=policy or config.staleness_policy, keep_prefix=config.recycle_keep_prefix, slack=config.drop_slack)
    outcome = scale_model.simulate(schedule)
    return outcome.samples_per_s(config.batch_size * config.group_size) / (e.time_scale or 1.0), outcome


def recipe_settings(overrides: list[str]) -> tuple[Any, tuple[int, ...]]:
    """The recipe's config under `overrides`, and its source's prompt lengths in tokens, in the groups' order."""
    from areal.engines.emulated.device import ByteTokenizer
    from areal.graph.recipe import load_recipe
    from areal.models.chat import encode_prompt
    from areal.runtime.staleness.admission import configured

    recipe = load_recipe(RECIPE, overrides)
    source = next(n for n in recipe.graph.nodes.values() if n.kind == "source")
    tasks = configured(source.spec.instantiate(), recipe.config)
    # dropped groups are refilled: the source runs further than the steps' own groups
    groups = 2 * (recipe.config.steps + recipe.config.staleness + 1) * recipe.config.batch_size
    tokenizer = ByteTokenizer()
    prompts = [len(encode_prompt(tokenizer, task["prompt"], False)) for task, _ in zip(tasks, range(groups))]
    return recipe.config, tuple(prompts)


def ideal(args: argparse.Namespace, tmp: Path) -> list[str]:
    """The zero-overhead model alone, far past what this machine can run: the share of N x one generator a perfect
    runtime keeps under each staleness bound, with the scaling table's batch and tail, over `--model-steps` steps."""
    lines = [f"{'generators':>10} " + " ".join(f"{f'η={eta} of N x one':>16}" for eta in args.model_etas)]
    ones: dict[int, float] = {}
    for n in args.model_generators:
        shares = []
        for eta in args.model_etas:
            overrides = weak_scaling(args, n, f"steps={args.model_steps}", f"staleness={eta}",
                                     f"emulation.trainer_gpus_per_rank={n}")
            rate = modelled_rate(overrides, generators=n)
            ones.setdefault(eta, rate / n)
            shares.append(rate / (ones[eta] * n))
        lines.append(f"{n:>10} " + " ".join(f"{share:>16.0%}" for share in shares))
    return lines


@dataclass(frozen=True)
class Prices:
    """What a policy paid for its rate, from the model's replay or from a run's step records."""

    lags: Counter[int]  # trained samples by lag: their step minus their oldest token's version
    trained_tokens: int  # output tokens the loss read
    stale_tokens: int  # of those, older than η at their step
    wasted_tokens: int  # generated, then read by no loss: dropped with their group, or masked
    generated_tokens: int  # output tokens of the samples trained or dropped
    length_ratio: float  # mean trained output length over the mean drawn one

    @classmethod
    def measured(cls, steps: list[dict[str, Any]], overrides: list[str]) -> Prices:
        """From a run's step records: each trained sample's lag, its tokens (masked, older than η) and the drops; the
        drawn lengths from the emulated engine's own draws for every sample the run started."""
        from areal.engines.emulated.device import OutputLengths

        config, _ = recipe_settings(overrides)
        lags = sum((Counter({int(k): v for k, v in s["staleness"].items()}) for s in steps), Counter())
        tokens = sum(s["tokens"] for s in steps)  # output tokens of the trained samples, masked ones too
        masked = sum(s.get("masked_tokens", 0) for s in steps)
        dropped = steps[-1]["dropped_tokens"]
        e, limit = config.emulation, config.generation.max_new_tokens
        lengths = OutputLengths(e.output_tokens_median, e.output_tokens_sigma, config.seed)
        drawn = statistics.mean(min(lengths.draw(sid, limit + 1), limit) for sid in range(steps[-1]["started"]))
        trained_mean = tokens / steps[-1]["trained_samples"]
        return cls(lags, tokens - masked, sum(s.get("stale_tokens", 0) for s in steps), masked + dropped,
                   tokens + dropped, trained_mean / drawn)

    @classmethod
    def of(cls, outcome: scale_model.Outcome) -> Prices:
        wasted = outcome.masked_tokens + outcome.dropped_tokens
        return cls(Counter(outcome.lags), outcome.trained_tokens, outcome.stale_tokens, wasted,
                   outcome.trained_tokens + wasted, outcome.length_ratio())

    def columns(self) -> str:
        lags = sorted(self.lags.elements())
        mean = statistics.mean(lags) if lags else math.nan
        p99 = lags[min(len(lags) - 1, int(0.99 * len(lags)))] if lags else 0
        stale = self.stale_tokens / self.trained_tokens if self.trained_tokens else 0.0
        wasted = self.wasted_tokens / self.generated_tokens if self.generated_tokens else 0.0
        return (f"{mean:>8.2f} {p99:>4} {max(lags, default=0):>4} {stale:>10.1%} {wasted:>7.1%} "
                f"{self.length_ratio:>13.2f}")


PRICES = f"{'lag mean':>8} {'p99':>4} {'max':>4} {'tokens > η':>10} {'wasted':>7} {'trained/drawn':>13}"


def policy_model(args: argparse.Namespace, tmp: Path) -> list[str]:
    """Every staleness policy in the zero-overhead model, far past what this machine can run: its rate as a share
    of N x one strict generator, and its price (lags, tokens older than η, tokens wasted, lengths)."""
    eta = args.policy_eta
    lines = [f"η = {eta}, σ = {args.sigma}, B = 2 groups of {GROUP} per generator, {args.model_steps} steps"
             + settings(args), "",
             f"{'generators':>10} {'policy':>9} {'of N x one strict':>17} {PRICES}"]
    one = None
    for n in args.model_generators:
        for policy in args.policies:
            overrides = weak_scaling(args, n, f"steps={args.model_steps}", f"staleness={eta}",
                                     f"emulation.trainer_gpus_per_rank={n}")
            rate, outcome = modelled(overrides, generators=n, policy=policy)
            one = one_strict(one, n, policy, rate)
            lines.append(f"{n:>10} {policy:>9} {share(rate, one, n):>17} {Prices.of(outcome).columns()}")
    return lines


def settings(args: argparse.Namespace) -> str:
    """The --set settings, for a table's title ("" when none)."""
    return "".join(f", {setting}" for setting in args.set)


def one_strict(known: float | None, generators: int, policy: str, rate: float) -> float | None:
    """The rate of one strict generator, once a row has measured it (None until then)."""
    return rate if known is None and generators == 1 and policy == "strict" else known


def share(rate: float, one: float | None, generators: int) -> str:
    """`rate` as a share of N x one strict generator; a dash when no row measured one (its --generators lack 1)."""
    return "—" if one is None else f"{rate / (one * generators):.0%}"


def policy_runs(args: argparse.Namespace, tmp: Path) -> list[str]:
    """Every staleness policy the runtime has, run on the emulated devices beside its zero-overhead model: the
    scaling table's runs (real time), as a share of N x the one strict generator this machine measured."""
    eta = args.policy_eta
    lines = [f"η = {eta}, σ = {args.sigma}, B = 2 groups of {GROUP} per generator, {args.steps} steps, real time"
             + settings(args), "",
             f"{'generators':>10} {'policy':>9} {'samples/s':>10} {'of N x one strict':>17} {'model':>8} "
             f"{'of model':>9} {PRICES}"]
    one = None
    for n in args.generators:
        for policy in args.policies:
            overrides = weak_scaling(args, n, f"staleness={eta}", f"emulation.trainer_gpus_per_rank={n}",
                                     f"staleness_policy={policy}")
            result = run(overrides, tmp / f"policy-{policy}-{n}")
            model_rate, _ = modelled(overrides, generators=n)
            rate = result["samples_per_s"]
            one = one_strict(one, n, policy, rate)
            lines.append(f"{n:>10} {policy:>9} {rate:>10.2f} {share(rate, one, n):>17} {model_rate:>8.2f} "
                         f"{rate / model_rate:>8.1%} {Prices.measured(result['steps'], overrides).columns()}")
    return lines


def ranks(args: argparse.Namespace, tmp: Path) -> list[str]:
    """The scaling table's run at `--rank-generators` generators, the same GPUs split over 1..8 trainer processes:
    what data-parallel ranks (a gloo all-reduce per update, each rank its share of the batch) cost the runtime."""
    n = args.rank_generators
    lines = [f"{n} generators, B = {2 * n} groups of {GROUP}, η = 2, {n} trainer GPUs in all", "",
             f"{'trainer ranks':>13} {'GPUs/rank':>10} {'samples/s':>10} {'of 1 rank':>10} {'model':>8} "
             f"{'of model':>9} {'ctl CPU ms/sample':>18} {'ctl msgs/s':>11} {'trainer CPU ms/sample':>22}"]
    single = None
    for k in args.trainer_ranks:
        overrides = weak_scaling(args, n, f"trainer.ranks={k}", f"emulation.trainer_gpus_per_rank={max(1, n // k)}")
        result = run(overrides, tmp / f"ranks-{k}")
        modelled = modelled_rate(overrides, generators=n)
        rate = result["samples_per_s"]
        single = single or rate
        trainer_cpu = result["pool_cpu_per_sample"]["actor"]  # every rank's process; the proximal pass runs there too
        lines.append(f"{k:>13} {max(1, n // k):>10} {rate:>10.2f} {rate / single:>9.0%} {modelled:>8.2f} "
                     f"{rate / modelled:>8.0%} {1000 * result['controller_cpu_per_sample']:>18.3f} "
                     f"{result['messages_per_s']:>11.1f} {1000 * trainer_cpu:>22.2f}")
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


TABLES = {"overlap": overlap, "scaling": scaling, "ideal": ideal, "ranks": ranks, "tails": tails,
          "policy_model": policy_model, "policy_runs": policy_runs}


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
    parser.add_argument("--scaling-time-scale", type=float, default=1.0,
                        help="scaling table: real seconds per modelled second (1: the host's cores stay mostly idle)")
    parser.add_argument("--rank-generators", type=int, default=8, help="ranks table: generators (and trainer GPUs)")
    parser.add_argument("--trainer-ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--model-generators", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256])
    parser.add_argument("--policies", nargs="+", choices=scale_model.POLICIES, default=list(scale_model.POLICIES),
                        help="policy tables: the staleness policies, strict first (its one-generator rate is the unit)")
    parser.add_argument("--policy-eta", type=int, default=2, help="policy tables: η")
    parser.add_argument("--model-etas", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--model-steps", type=int, default=60,
                        help="ideal table: trainer steps (past the first η, which only drain what version 0 started)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a recipe setting for every run and model of the tables (a table's own settings win), "
                             "e.g. generation.max_batch=8: a generator holding more samples than slots")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="areal-bench-scale-") as tmp:
        for name in args.tables:
            print(f"running {name} ...", file=sys.stderr, flush=True)
            lines = TABLES[name](args, Path(tmp))
            print(f"\n## {name}\n" + "\n".join(lines), flush=True)


if __name__ == "__main__":
    main()

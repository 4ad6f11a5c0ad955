"""The live view of a run, and the summary table at its end (rich); the same for `areal eval`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from areal.runtime.records.learning import verdict
from areal.runtime.staleness.policies import policy_named

if TYPE_CHECKING:
    from areal.runtime.controller.controller import Controller


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "—" if value is None else format(value, spec)


def live_table(controller: Controller) -> Table:
    s = controller.state
    step = s.last_step
    t = Table(title=f"areal · {controller.plan.graph} · {s.status}", show_header=False, min_width=60)
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("policy version", f"{s.version} / {s.steps}")
    t.add_row("elapsed", f"{controller._elapsed():.0f} s")
    t.add_row("samples/s (trained)", _fmt(step.get("samples_per_s"), ".2f"))
    t.add_row("tokens/s (generated)", _fmt(step.get("generated_tokens_per_s"), ".0f"))
    t.add_row("reward mean (last batch)", _fmt(step.get("reward_mean")))
    last_eval = s.evals[-1] if s.evals else None
    if last_eval:
        t.add_row("held-out pass@1", f"{_pass(last_eval)} at version {last_eval['version']} (first "
                  f"{_pass(s.evals[0])}; {verdict(s.evals[0], last_eval)})")
    t.add_row(f"staleness ({controller.config.staleness_policy}; lag: samples)",
              ", ".join(f"{k}: {v}" for k, v in sorted(s.staleness.items())) or "—")
    acc = controller.accounting.summary()
    t.add_row("samples", f"started {acc['started']} · trained {acc['trained']} · failed {acc['failed']}"
              f" · filtered {acc['filtered']} · dropped {acc['dropped']} · in flight {acc['in_flight']}")
    busy = " · ".join(f"{w.worker_id}{_on(w.process.node)} {w.busy:.0%}" for w in controller.workers.values())
    t.add_row("busy", busy or "—")
    if long := [f"{w.worker_id}: {w.long_call}" for w in controller.workers.values() if w.long_call]:
        t.add_row("long node calls", "\n".join(long), style="yellow")
    return t


class ProgressLines:
    """The live view where there is no terminal to redraw (`areal run ... > log`, a batch job): a line per step at
    most every `every_s`, each held-out round as it is scored, and each long node call once. A live view there
    printed its last frame only, so a log showed nothing until the run ended."""

    def __init__(self, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.clock = every_s, clock
        self._printed_at, self._version, self._evals, self._long_calls = -every_s, 0, 0, 0

    def lines(self, controller: Controller, final: bool = False) -> list[str]:
        """What to print now (often nothing); `final`: the run ended, so its last step is said whenever it came."""
        s, now, found = controller.state, self.clock(), []
        for record in s.evals[self._evals:]:
            found.append(f"held-out pass@1 {_pass(record)} at version {record['version']}")
        for call in s.long_calls[self._long_calls:]:
            found.append(f"long node call: {call}")
        self._evals, self._long_calls = len(s.evals), len(s.long_calls)
        if s.version != self._version and (final or now - self._printed_at >= self.every_s):
            step = s.last_step
            found.insert(0, f"version {s.version}/{s.steps} · {controller._elapsed():.0f} s · reward "
                            f"{_fmt(step.get('reward_mean'))} · {_fmt(step.get('samples_per_s'), '.1f')} samples/s · "
                            f"{_fmt(step.get('generated_tokens_per_s'), '.0f')} tokens/s")
            self._printed_at, self._version = now, s.version
        return found


def summary_table(controller: Controller) -> Table:
    s = controller.state
    step = s.last_step
    t = Table(title="run summary", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("run directory", str(controller.run_dir))
    if controller.metrics.trackers:
        t.add_row("trackers", "\n".join(tracker.where for tracker in controller.metrics.trackers))
    t.add_row("mode", f"{controller.config.mode} (η = {controller.config.effective_staleness})")
    t.add_row("policy versions", str(s.version))
    t.add_row("wall-clock", f"{controller._elapsed():.1f} s")
    t.add_row("trained samples/s", _fmt(step.get("samples_per_s"), ".2f"))
    # over the whole run from the workers' last counts (sent as they stop): a step's figure is as of the generators'
    # last pulse, none yet in a run of under a second
    generated = sum(w.counts.get("tokens", 0) for w in controller.workers.values())
    t.add_row("generated tokens/s", f"{generated / controller._elapsed():.0f}")
    if split := generator_time_line(step):
        t.add_row("generator time (last step)", split)
    t.add_row("CPU by process", cpu_line(controller))
    if s.evals:
        t.add_row("held-out pass@1", " → ".join(f"{_pass(e)}@v{e['version']}" for e in s.evals))
        if len(s.evals) > 1:
            t.add_row("held-out gain", verdict(s.evals[0], s.evals[-1]))
    if s.first_entropy is not None and "entropy" in step:  # a policy that stops exploring shows here first
        t.add_row("policy entropy", f"{s.first_entropy:.3f} → {step['entropy']:.3f} nats per trained token")
    t.add_row("staleness", staleness_line(controller))
    t.add_row("staleness histogram", ", ".join(f"lag {k}: {v}" for k, v in sorted(s.staleness.items())) or "—")
    acc = controller.accounting.summary()
    t.add_row("accounting", " · ".join(f"{k} {v}" for k, v in acc.items()))
    if s.truncated_masked or controller.config.trainer.truncated == "mask":
        t.add_row("cut outputs", f"{s.truncated_masked} trained samples cut at max_new_tokens, every token of them "
                  "out of the loss (trainer.truncated=mask)")
    if controller.skipped_tasks:
        t.add_row("skipped task records", f"{controller.skipped_tasks} — first: {controller.bad_tasks[0]}")
    reasons = controller.accounting.fail_reasons
    if reasons:
        t.add_row("failures", ", ".join(f"{k}: {v}" for k, v in reasons.most_common()))
    if controller.steps.said:  # what the step records warned about, each once (metrics.jsonl has them too)
        t.add_row("warnings", "\n".join(controller.steps.said.values()))
    if s.long_calls:  # each as first said (the worker's log has its stack)
        t.add_row("long node calls", "\n".join(s.long_calls))
    return t


def generator_time_line(step: dict[str, Any]) -> str:
    """The generators' engine time per phase in a step record ("" when their engine cannot tell, as vLLM's):
    `rebuild` is re-reading running rows under new weights, what interruptible generation costs."""
    shares = {k.removeprefix("generator_").removesuffix("_share"): v for k, v in step.items()
              if k.startswith("generator_") and k.endswith("_share")}
    return " · ".join(f"{phase} {share:.0%}" for phase, share in shares.items())


def cpu_line(controller: Controller) -> str:
    """CPU seconds of each worker's process tree (a code reward's sandboxed programs are its worker's) and of the
    controller, largest first, with shares, and the cores they kept busy on average over the run's wall-clock.

    The wall-clock includes the start-up, as the CPU does (each worker's imports and model load): throughput
    counts from the end of start-up, and dividing by that alone claimed more cores than a short run's machine has."""
    state = controller.state
    used = {w.worker_id: w.cpu_total for w in controller.workers.values()}
    used["controller"] = time.process_time() - state.cpu_at_start
    total = sum(used.values())
    shares = " · ".join(f"{name} {spent:.0f} s ({spent / total:.0%})"
                        for name, spent in sorted(used.items(), key=lambda item: -item[1]))
    return f"{shares}; {total / (state.startup_s + controller._elapsed()):.2f} cores on average"


def staleness_line(controller: Controller) -> str:
    """The policy, what it bounds, and what the run measured: the lag of trained samples, tokens trained or masked
    past η, the samples dropped, and (recycle) the groups re-queued."""
    config, s = controller.config, controller.state
    policy = policy_named(config.staleness_policy, config.recycle_keep_prefix)
    lags = sorted(s.staleness.elements())
    measured = (f"lag mean {sum(lags) / len(lags):.2f}, max {lags[-1]}" if lags else "no sample trained")
    tokens = max(s.trained_tokens, 1)
    acc = controller.accounting.summary()
    return (f"{policy.describe(config.effective_staleness)} — measured: {measured}; older than η: "
            f"{s.stale_tokens} tokens trained ({s.stale_tokens / tokens:.1%}), {s.masked_tokens} masked "
            f"({s.masked_tokens / tokens:.1%}); dropped {acc['dropped']} samples ({acc['dropped_tokens']} tokens)"
            + (f"; recycled {acc['recycled']} groups ({acc['recycled_tokens']} tokens re-queued)"
               if policy.recycles else "")
            + (f"; {config.drop_slack} groups admitted past the gate (drop_slack)" if config.drop_slack else "")
            + ("; running rows kept their KV across weight updates (generation.on_new_weights=keep-kv)"
               if config.generation.keeps_kv else ""))


def _pass(record: dict) -> str:
    se = record.get("pass@1_se")
    return f"{record['pass@1']:.3f}" + (f" ± {se:.3f}" if se is not None else "")


def _on(node: str) -> str:
    """Where a worker runs, for workers Ray placed ("@10.0.0.7"); nothing for local processes."""
    return "" if node == "local" else f"@{node}"


@contextmanager
def eval_progress(console: Console, quiet: bool) -> Iterator[Callable[[str, int, int], None]]:
    """A `report(phase, done, total)` callback that draws one bar per phase (generate, judge)."""
    if quiet:
        yield lambda phase, done, total: None
        return
    if not console.is_terminal:  # a log file: bars would show only at the end
        yield progress_lines(console)
        return
    columns = (TextColumn("{task.description:<9}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        bars: dict[str, Any] = {}

        def report(phase: str, done: int, total: int) -> None:
            if phase not in bars:
                bars[phase] = progress.add_task(phase, total=total)
            progress.update(bars[phase], completed=done, total=total)

        yield report


def progress_lines(console: Console, every_s: float = 30.0,
                   clock: Callable[[], float] = time.monotonic) -> Callable[[str, int, int], None]:
    """`report(phase, done, total)` as a line per phase at most every `every_s`, and one when the phase is done."""
    began = clock()
    said: dict[str, tuple[float, int]] = {}  # phase -> when its last line was printed, and its count then

    def report(phase: str, done: int, total: int) -> None:
        now = clock()
        at, count = said.get(phase, (-every_s, -1))
        if done != count and (done == total or now - at >= every_s):
            said[phase] = (now, done)
            console.print(f"{phase} {done}/{total} ({done / max(total, 1):.0%}) · {now - began:.0f} s",
                          highlight=False)

    return report


def eval_table(document: dict[str, Any]) -> Table:
    """The summary of an `areal eval` document: pass@k, reward, failures, timings."""
    s = document["summary"]
    settings = document["settings"]
    t = Table(title=f"areal eval · {document['benchmark']}", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("model", f"{document['model']}" + (f" ({document['checkpoint']})"
                                                if document["checkpoint"] != document["model"] else ""))
    sampling = "greedy" if settings["temperature"] == 0 else f"T={settings['temperature']}, top_p={settings['top_p']}"
    t.add_row("tasks × samples", f"{s['tasks']} × {s['samples'] // max(s['tasks'], 1)} ({sampling}, "
              f"chat template {'on' if settings['chat'] else 'off'}, ≤{settings['max_new_tokens']} new tokens)")
    for k in settings["ks"]:
        t.add_row(f"pass@{k}", f"{s[f'pass@{k}']:.4f}")
    t.add_row("mean reward", f"{s['reward_mean']:.4f}")
    t.add_row("failures", ", ".join(f"{k}: {v}" for k, v in s["failures"].items()) or "—")
    where = f" on {settings['device']} ({settings['dtype']})" if "device" in settings else ""  # older files: the CPU
    t.add_row("generated", f"{s['generated_tokens']} tokens, {s['tokens_per_s']:.0f} tokens/s{where}")
    t.add_row("wall-clock", f"{s['wall_s']:.1f} s (load {s['load_s']:.1f}, generate {s['generate_s']:.1f}, "
              f"judge {s['judge_s']:.1f})")
    return t

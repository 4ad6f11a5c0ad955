"""Settings and inputs that used to misbehave quietly now stop with a message naming the setting or the file."""

from __future__ import annotations

import io
import json
import logging
import math
import os
import re
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from areal.cli.progress import summary_table
from areal.cli.run import build_controller
from areal.config import RunConfig
from areal.data.jsonl import jsonl_tasks
from areal.errors import ConfigError, RecipeError, RunError
from areal.overrides import apply_overrides
from areal.runtime.records.evaluation import first_pass
from tests.local_model import make_checkpoint

RECIPE = Path(__file__).with_name("fake_rl.py")
TINY_RL = Path(__file__).with_name("tiny_rl.py")


def _controller(tmp_path: Path, recipe: Path, *overrides: str):
    copy = tmp_path / recipe.name
    shutil.copy(recipe, copy)
    return build_controller(copy, list(overrides), tmp_path / "run")


@pytest.mark.parametrize(("override", "says"), [
    ("faults.heartbeat_s=20", "dead_after_s=10.0 must be more than twice heartbeat_s=20.0"),
    ("batch_size=100000000", "batch_size: input should be less than or equal to 65536"),
    ("generation.max_new_tokens=100000000", "generation.max_new_tokens: input should be less than or equal to"),
])
def test_settings_that_cannot_work_are_refused_naming_them(override, says):
    with pytest.raises(ConfigError, match=says):
        apply_overrides(RunConfig(), [override])


def test_placement_of_a_node_that_has_no_pool_of_its_own_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"placement: 'actor', 'rolout' starts no pool of its own.*placement takes: "
                                          r"rollout \(a trainer's are trainer.ranks\)"):
        _controller(tmp_path, RECIPE, 'placement={"rolout": 2, "actor": 2}')


def test_max_new_tokens_beyond_the_models_context_stops_the_run_at_once_naming_the_setting(tmp_path):
    model = make_checkpoint(tmp_path / "ckpt")  # max_position_embeddings=256
    controller = _controller(tmp_path, TINY_RL, f"model={model}", "generation.max_new_tokens=5000",
                             "trainer.microbatch_tokens=8192")
    with pytest.raises(RunError, match=r"generation.max_new_tokens=5000 leaves no room for a prompt in the model's "
                                       r"context of 256 tokens (?s:.*)while setting up") as raised:
        controller.run()
    assert 'File "' not in str(raised.value)  # a user error is its message, not areal's frames that checked it


def test_one_sample_per_group_warns_once_that_the_update_moves_nothing(tmp_path, caplog):
    model = make_checkpoint(tmp_path / "ckpt")
    controller = _controller(tmp_path, TINY_RL, f"model={model}", "group_size=1", "steps=2")
    with caplog.at_level(logging.WARNING, "areal.controller"):
        controller.run()
    warnings = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
                if '"warning"' in line and "advantage" in line]
    assert len(warnings) == 1 and "every advantage of step 1 is 0" in warnings[0]["warning"]
    assert "group_size=1" in warnings[0]["warning"]


def test_a_graph_without_a_trainer_is_refused_before_its_run_directory_exists(tmp_path):
    recipe = tmp_path / "untrained.py"
    recipe.write_text(TINY_RL.read_text().replace('g.add(ppo_update("actor"))', ""))
    with pytest.raises(RecipeError, match=r"untrained.py: graph 'tiny-rl' has no trainer \(ppo_update, or a node of "
                                          r"role='trainer'\): nothing would train.*steps=4"):
        build_controller(recipe, [], tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_run_whose_every_completion_is_cut_to_nothing_warns_once_naming_the_stop_strings(tmp_path):
    from areal.models.tokenizer import ALPHABET

    model = make_checkpoint(tmp_path / "ckpt")
    stops = json.dumps(list(ALPHABET))  # a stop string at every character: every completion is cut to nothing
    controller = _controller(tmp_path, TINY_RL, f"model={model}", f"generation.stop={stops}", "steps=2")
    controller.run()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if line["kind"] == "step"]
    assert [(s["empty_share"], s["over_long_share"]) for s in steps] == [(1.0, 0.0), (1.0, 0.0)]
    warnings = [line["warning"] for line in lines if line["kind"] == "warning" and "empty" in line["warning"]]
    assert len(warnings) == 1 and "every sample step 1 trained had an empty completion" in warnings[0]
    assert "generation.stop" in warnings[0]
    console = Console(file=io.StringIO(), width=400)
    console.print(summary_table(controller))
    summary = console.file.getvalue()  # said at the end too, where a run without the live view shows nothing else
    assert "warnings" in summary and "every sample step 1 trained had an empty completion" in summary


def test_a_step_of_cut_completions_warns_once_and_a_step_with_one_whole_one_does_not():
    from areal.runtime.records.steps import StepRecorder

    steps = StepRecorder(0, group_size=4, several_trainers=False)

    def warned(version: int, share: float) -> list[str]:
        return [w["warning"] for w in steps.warnings({"version": version, "wall_s": 1.0, "over_long_share": share})]

    assert warned(1, 0.75) == []
    said = warned(2, 1.0)
    assert len(said) == 1 and "every sample step 2 trained was cut at generation.max_new_tokens" in said[0]
    assert warned(3, 1.0) == []  # once a run


@pytest.mark.parametrize(("group_size", "hint"), [(1, "group_size=1: a group-relative advantage is 0 for a group "
                                                    "of one sample"), (8, "every group's samples had equal rewards")])
def test_a_step_of_zero_advantages_says_the_likelier_cause_for_the_group_size(group_size, hint):
    from areal.runtime.records.steps import StepRecorder

    said = StepRecorder(0, group_size=group_size, several_trainers=False).warnings(
        {"version": 3, "wall_s": 1.0, "zero_advantage": 1.0})
    assert len(said) == 1 and said[0]["warning"].startswith("every advantage of step 3 is 0") and hint in said[0][
        "warning"]
    assert ("group_size" in said[0]["warning"]) == (group_size == 1)  # a group of 8 is no cause to name


def test_held_out_tasks_are_one_pass_of_the_file_and_repeated_ids_are_kept_and_named(tmp_path, caplog):
    path = tmp_path / "heldout.jsonl"
    tasks = [{"task_id": tid, "problem": f"{i} + 1", "answer": str(i + 1)} for i, tid in enumerate("abcab")]
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    source = jsonl_tasks(path, schema="math", seed=0)
    with caplog.at_level(logging.WARNING, "areal.controller"):
        first = first_pass(source, 100)
    assert sorted(t["answer"] for t in first) == ["1", "2", "3", "4", "5"]  # all five, and no sixth from pass two
    assert "held-out tasks repeat task_id 'a', 'b'" in caplog.text


def test_a_record_nested_too_deeply_is_skipped_and_named_by_line(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"problem": "1 + 1", "answer": "2"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    source = jsonl_tasks(path, schema="math", seed=0)
    assert next(iter(source))["answer"] == "2"
    assert source.problems == [f"{path}:2: the JSON is nested too deeply to read"]


def test_a_read_only_run_directory_stops_a_restart_with_the_path_named(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_STEP_WORK", "30")
    controller = _controller(tmp_path, RECIPE, "steps=50", "batch_size=1", "group_size=1")
    logs = Path(controller.plan.run_dir) / "logs"
    done: list[bool] = []

    def on_event(c) -> None:
        worker = c.workers.get("rollout[0]")
        if not done and c.state.version >= 1 and worker is not None and worker.process.poll() is None:
            done.append(True)
            for log in logs.iterdir():
                log.chmod(0o444)
            logs.chmod(0o555)  # what a read-only remount does to a restart
            worker.process.kill()

    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder anyway")
    controller.on_event = on_event
    try:
        with pytest.raises(RunError, match=r"cannot start rollout\[0\]: Permission denied .*rollout-0\.log.*writable"):
            controller.run()
    finally:
        logs.chmod(0o755)
        for log in logs.iterdir():
            log.chmod(0o644)


def test_a_run_in_a_directory_too_deep_for_socket_paths_runs_and_leaves_no_socket_file(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_ADVANTAGE_POOL", "1")
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    controller = build_controller(recipe, ["steps=2", "batch_size=1", "group_size=1"], deep / "run")
    assert len(controller.plan.control_endpoint) <= 107 + len("ipc://")
    state = controller.run()
    assert state.version == 2
    sockets = [Path(e.removeprefix("ipc://")) for c in controller.plan.channels for e in c.endpoints]
    assert sockets and not any(s.exists() for s in sockets)
    assert not Path(controller.plan.control_endpoint.removeprefix("ipc://")).exists()
    assert os.listdir(deep / "run" / "sockets") == []


def test_a_node_that_reads_what_the_trainer_reads_runs_as_a_side_branch_and_the_run_trains_on(tmp_path):
    # it used to be compiled after the update and killed the trainer; now, with a pool of its own, it is a branch
    recipe = tmp_path / "fake_rl.py"
    recipe.write_text(RECIPE.read_text() + (
        "\n\n@node(inputs={'advantage': Float['S']}, outputs={'watched': Float['S']})\n"
        "def watch(batch):\n    return {'watched': batch['advantage'], '__metrics__': {'watched_mean': 0.5}}\n\n\n"
        "g.add(watch, pool=1)\n"))
    controller = build_controller(recipe, ["steps=3"], tmp_path / "run")
    watch = controller.plan.pool_of("watch")
    assert watch.name == "watch" and controller.plan.pool_of("actor").name == "actor"
    verdict = [c for c in controller.plan.channels if (c.src, c.dst) == ("watch", "actor")]
    assert [c.fields for c in verdict] == [()]  # the trainer waits for the side branch's verdict: ids only
    state = controller.run()
    assert state.version == 3 and controller.accounting.summary()["trained"] == 3 * 2 * 3
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if '"step"' in line]
    assert any(s.get("watched_mean") == 0.5 for s in steps)  # its numbers reached the step's metrics


def test_recycle_beside_an_episode_which_cannot_be_requeued_is_refused_naming_it(tmp_path):
    from areal.graph.recipe import load_recipe
    from areal.runtime.compiler.compile import compile_plan

    recipe = load_recipe(Path(__file__).with_name("episode_rl.py"), ["staleness_policy=recycle"])
    with pytest.raises(ConfigError, match=r"staleness_policy=recycle: .*episode_rl\.py:\d+: node '\w+' \(episode\) is "
                                          r"an episode, which is not interrupted mid-way"):
        compile_plan(recipe.graph, recipe.config)


def test_masking_cut_outputs_where_no_node_says_which_were_cut_is_refused_naming_the_trainer(tmp_path):
    from areal.graph.recipe import load_recipe
    from areal.runtime.compiler.compile import compile_plan

    recipe = load_recipe(Path(__file__).with_name("episode_rl.py"), ["trainer.truncated=mask"])
    with pytest.raises(ConfigError, match=r"trainer.truncated=mask: no node outputs `truncated` for .*episode_rl\.py:"
                                          r"\d+: node '\w+' \(ppo-update\)"):
        compile_plan(recipe.graph, recipe.config)
    recipe = load_recipe(TINY_RL, ["trainer.truncated=mask"])  # a generate node says it
    assert ("actor", "truncated", "rollout.truncated") in compile_plan(recipe.graph, recipe.config).bindings


def test_the_summary_counts_every_generated_token_even_before_a_generators_first_pulse(tmp_path):
    # pulses every 30 s: none reaches the controller in this run, only the counts each worker sends as it stops
    model = make_checkpoint(tmp_path / "ckpt")
    controller = _controller(tmp_path, TINY_RL, f"model={model}", "steps=2", "faults.heartbeat_s=30",
                             "faults.dead_after_s=90")
    state = controller.run()
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if '"kind": "step"' in line]
    assert steps[-1]["generated_tokens_per_s"] == 0  # what the last step's record knew
    console = Console(file=io.StringIO(), width=400)
    console.print(summary_table(controller))
    shown = float(re.search(r"generated tokens/s\s*│\s*(\d+)", console.file.getvalue()).group(1))
    # the trained outputs were generated here; the summary shows whole tokens/s (82.1 as 82)
    assert shown >= math.floor(state.trained_tokens / controller._elapsed()) > 0

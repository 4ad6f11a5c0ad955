"""Checkpoints and --resume: after a clean stop or a kill -9 of the whole run, nothing acknowledged
is trained twice and nothing is skipped, and a deterministic sync run resumes to the same weights."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from areal.cli.run import run_recipe
from areal.errors import ConfigError
from tests.local_model import make_checkpoint
from tests.spawned import end_session, wait_gone

RECIPE = Path(__file__).with_name("fake_rl.py")
TINY_RL = Path(__file__).with_name("tiny_rl.py")  # a real model in sync mode, a checkpoint every 2 steps
B, G = 2, 3


def _trained(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "trained.jsonl").read_text().splitlines()]


def _ids(records: list[dict]) -> list[int]:
    return [sid for r in records for sid in r["sample_ids"]]


def _holding(run: Path) -> list[int]:
    """The live processes (not zombies) holding a file of this run directory open: its workers, read from /proc."""
    found = []
    for process in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, IndexError):
            if (process / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if any(os.readlink(fd).startswith(f"{run}/") for fd in (process / "fd").iterdir()):
                found.append(int(process.name))
    return found


def test_resume_after_a_clean_stop_continues_the_source(tmp_path):
    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    run = tmp_path / "run"
    assert run_recipe(recipe, overrides=["steps=4"], run_dir=run, live=False) == 0
    assert (run / "checkpoints" / "step-000004" / "controller.json").exists()
    assert run_recipe(recipe, overrides=["steps=7"], resume=run, live=False) == 0
    records = _trained(run)
    assert [r["version"] for r in records] == list(range(7))
    assert sorted(_ids(records)) == list(range(7 * B * G)) and len(set(_ids(records))) == 7 * B * G
    # the run's wall-clock goes on across the resume: its step lines are one curve against time
    steps = [line for line in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
             if line["kind"] == "step"]
    assert [line["version"] for line in steps] == list(range(1, 8))
    checkpoint_wall = json.loads((run / "checkpoints" / "step-000004" / "controller.json").read_text())["wall_s"]
    assert steps[3]["wall_s"] <= checkpoint_wall < steps[4]["wall_s"]
    assert all(a["wall_s"] < b["wall_s"] for a, b in zip(steps, steps[1:]))


def test_kill_9_of_the_whole_run_then_resume_trains_each_acknowledged_sample_once(tmp_path):
    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    run = tmp_path / "run"
    env = {**os.environ, "FAKE_STEP_WORK": "80"}
    argv = [sys.executable, "-m", "areal.cli", "run", str(recipe), "--run-dir", str(run), "-q",
            "--set", "steps=1000", "--set", "checkpoint.interval_steps=3"]
    log = tmp_path / "run.log"
    proc = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=log.open("w"))
    try:
        def second_checkpoint_done() -> bool:  # step 6 or later: older ones are pruned (keep=2) as the run goes
            done = (run / "checkpoints").glob("step-*/controller.json")
            return any(int(p.parent.name.split("-")[1]) >= 6 for p in done)

        for _ in range(600):  # up to 120 s, checking every 0.2 s while the run is alive
            if second_checkpoint_done() or proc.poll() is not None:
                break
            try:
                proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
        assert proc.poll() is None, f"the run ended before it was killed:\n{log.read_text()[-3000:]}"
        assert second_checkpoint_done(), f"the run never reached its second checkpoint:\n{log.read_text()[-3000:]}"
    finally:
        end_session(proc)  # the controller; its fork server and workers die with it
    # the workers die after the controller (each with its parent, in a session of its own): one still writing a
    # step's record when `before` was read would be taken for the resumed run's (CI saw it once)
    left = wait_gone(_holding(run), timeout_s=30)
    assert not left, f"processes {left} of the killed run outlived it by 30 s"
    before = _trained(run)
    done = sorted(p for p in (run / "checkpoints").glob("step-*") if (p / "controller.json").exists())
    acknowledged = int(done[-1].name.split("-")[1])
    assert acknowledged >= 6
    steps = acknowledged + 6  # past the checkpoint however far the run got: a finished run is not resumed
    assert run_recipe(recipe, overrides=[f"steps={steps}"], resume=run, live=False) == 0
    after = _trained(run)[len(before):]
    kept = [r for r in before if r["version"] < acknowledged]  # work after the checkpoint is rolled back
    ids = _ids(kept) + _ids(after)
    assert [r["version"] for r in kept + after] == list(range(steps))
    assert sorted(ids) == list(range(steps * B * G))  # none skipped, none twice


def test_sync_run_resumed_from_a_mid_run_checkpoint_ends_with_bitwise_the_same_weights(tmp_path):
    model = make_checkpoint(tmp_path / "ckpt")
    # one sequence at a time: decoded beside other rows, a row's logits round differently (~1e-7)
    # with its neighbours' lengths, so behav_logp, and with it the update, would depend on when
    # each group reached the generator. Alone, each sample's numbers are a function of its id.
    overrides = [f"model={model}", "generation.max_batch=1", "steps=6", "checkpoint.keep=3"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert run_recipe(TINY_RL, overrides=overrides, run_dir=whole, live=False) == 0
    # the run killed after its step-2 checkpoint: weights v4..v6 are rolled-back work, which the
    # resumed trainer must replace, not keep in place of the v3 it publishes
    shutil.copytree(whole, cut, ignore=shutil.ignore_patterns("sockets"))
    for step in (4, 6):
        shutil.rmtree(cut / "checkpoints" / f"step-{step:06d}")
    assert run_recipe(TINY_RL, resume=cut, live=False) == 0
    final = [load_file(run / "checkpoints" / "step-000006" / "trainer-actor" / "model" / "model.safetensors")
             for run in (whole, cut)]
    start = load_file(model / "model.safetensors")
    assert final[0].keys() == final[1].keys()
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])
    assert not all(torch.equal(final[0][k], start[k]) for k in start)  # the updates moved the weights


def test_a_recipes_list_of_tasks_resumes_with_the_task_after_the_last_one_started(tmp_path):
    from areal.runtime.records.sample_records import read_samples

    recipe = tmp_path / "list_rl.py"
    recipe.write_text(RECIPE.read_text().replace('g.source("tasks", Counting(),',
                                                  'g.source("tasks", [{"prompt": f"p{i}"} for i in range(5)],'))
    run = tmp_path / "run"
    assert run_recipe(recipe, overrides=["steps=4"], run_dir=run, live=False) == 0
    assert run_recipe(recipe, overrides=["steps=7"], resume=run, live=False) == 0
    trained = {sid for r in _trained(run) for sid in r["sample_ids"]}
    prompts = {s.group_id: s.fields["rollout.prompt"] for s in read_samples(run).values() if s.sample_id in trained}
    assert sorted(prompts) == list(range(7 * B))  # every group once, across the resume
    assert all(prompt == f"p{group % 5}" for group, prompt in prompts.items())  # the list in order, epoch on epoch


def test_resuming_a_run_that_reached_its_steps_is_refused_saying_how_to_train_on(tmp_path):
    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    run = tmp_path / "run"
    assert run_recipe(recipe, overrides=["steps=3"], run_dir=run, live=False) == 0
    metrics = (run / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match=r"is at version 3 and steps=3: nothing is left to train; resume with "
                                          r"--set steps=N above 3"):
        run_recipe(recipe, resume=run, live=False)
    assert (run / "metrics.jsonl").read_text() == metrics  # no held-out round, no line, of a run with nothing to do

"""--resume after damage: checkpoints are whole or skipped by name; settings that shape ids are kept; the
metrics are not repeated; old checkpoints are pruned; a damaged run directory is named, not a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from areal.cli.run import build_controller, run_recipe
from areal.errors import ConfigError, RecipeError
from areal.graph.recipe import load_recipe
from areal.runtime.storage.resume import RECIPE_COPY, check_changes, recipe_hash, resume_point

RECIPE = Path(__file__).with_name("fake_rl.py")
B, G = 2, 3  # fake_rl's config


def _run(tmp_path: Path, *overrides: str) -> tuple[Path, Path]:
    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    run = tmp_path / "run"
    assert run_recipe(recipe, overrides=["checkpoint.interval_steps=2", *overrides], run_dir=run, live=False) == 0
    return recipe, run


def _records(run: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def test_a_checkpoint_cut_short_is_skipped_by_name_and_the_older_one_resumes_exactly_once(tmp_path, capsys):
    recipe, run = _run(tmp_path, "steps=4", "checkpoint.keep=3")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000002", "step-000004"]  # no partials
    policy = run / "checkpoints" / "step-000004" / "policy-actor.safetensors"
    policy.write_bytes(policy.read_bytes()[:-1])  # a kill -9 in the middle of a write, as it would have looked
    before = [json.loads(line) for line in (run / "trained.jsonl").read_text().splitlines()]
    assert run_recipe(recipe, overrides=["steps=6"], resume=run, live=False) == 0
    said = " ".join(capsys.readouterr().err.split())  # the console wraps long lines
    assert "skipped checkpoint" in said and "step-000004: policy-actor.safetensors is" in said
    assert "resuming" in said and "from step-000002" in said
    after = [json.loads(line) for line in (run / "trained.jsonl").read_text().splitlines()][len(before):]
    kept = [r for r in before if r["version"] < 2]
    ids = [s for r in kept + after for s in r["sample_ids"]]
    assert [r["version"] for r in kept + after] == list(range(6))
    assert sorted(ids) == list(range(6 * B * G))


def test_resume_refuses_a_change_to_what_shapes_sample_ids_and_reports_every_other(tmp_path, capsys):
    recipe, run = _run(tmp_path, "steps=2")
    with pytest.raises(ConfigError, match=r"batch_size 2 -> 4; group_size 3 -> 2: these shape sample ids"):
        run_recipe(recipe, overrides=["steps=4", "batch_size=4", "group_size=2"], resume=run, live=False)
    capsys.readouterr()
    # these may change, and each change is said
    assert run_recipe(recipe, overrides=["steps=3", "staleness=0", "trainer.lr=0.002"], resume=run, live=False) == 0
    said = capsys.readouterr().err
    assert "resuming with changed settings:" in said
    for change in ("staleness 1 -> 0", "steps 2 -> 3", "trainer.lr 0.0003 -> 0.002"):
        assert f"  {change}\n" in said
    assert "checkpoint.interval_steps" not in said  # the recorded overrides are applied again: not a change


def _recorded_run(tmp_path: Path) -> tuple[Path, Path]:
    """A run directory as a started run leaves it (plan.json, config.json, the recipe's copy), without running."""
    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    run = tmp_path / "run"
    plan = build_controller(recipe, ["steps=2"], run).plan
    run.joinpath("plan.json").write_text(plan.to_json())
    shutil.copy(recipe, run / RECIPE_COPY)
    return recipe, run


def test_the_plan_records_the_recipes_hash_and_an_edited_recipe_is_refused_showing_the_edit(tmp_path):
    recipe, run = _recorded_run(tmp_path)
    assert json.loads((run / "plan.json").read_text())["recipe_sha256"] == recipe_hash(recipe)
    assert resume_point(run).recipe_edit == []
    recipe.write_text(recipe.read_text().replace("staleness=1", "staleness=0"))
    with pytest.raises(RecipeError, match=r"(?s)the recipe .*fake_rl\.py was edited since the run was made:.*"
                                          r"-config = RunConfig\(batch_size=2, group_size=3, staleness=1, steps=6\).*"
                                          r"\+config = RunConfig\(batch_size=2, group_size=3, staleness=0, steps=6\).*"
                                          r"--allow-recipe-change"):
        resume_point(run)
    edit = resume_point(run, allow_recipe_change=True).recipe_edit
    assert [line[0] for line in edit[2:]] == ["-", "+"] and "staleness=0" in edit[-1]


def test_a_moved_recipe_resumes_from_where_it_is_now_with_its_text_checked(tmp_path):
    recipe, run = _recorded_run(tmp_path)
    other = tmp_path / "other.py"
    shutil.copy(recipe, other)
    with pytest.raises(RecipeError, match=r"that run was made by .*fake_rl\.py, not .*other\.py"):
        resume_point(run, other)  # the run's own recipe is still there: another file is another recipe
    moved = tmp_path / "moved" / "fake_rl.py"
    moved.parent.mkdir()
    recipe.rename(moved)
    with pytest.raises(RecipeError, match=rf"cannot read the run's recipe .*fake_rl\.py \(No such file or directory\); "
                                          rf"moved\? name it where it is now: areal run NEW/PATH\.py --resume {run}"):
        resume_point(run)
    assert resume_point(run, moved).recipe == str(moved.resolve())
    moved.write_text(moved.read_text().replace("staleness=1", "staleness=0"))  # moved and edited: the edit is caught
    with pytest.raises(RecipeError, match=r"was edited since the run was made"):
        resume_point(run, moved)


def test_resume_with_every_checkpoint_unreadable_is_refused_naming_each_unless_told_to_start_over(tmp_path):
    _, run = _recorded_run(tmp_path)
    for step in (2, 4):
        folder = run / "checkpoints" / f"step-{step:06d}"
        folder.mkdir(parents=True)
        (folder / "controller.json").write_text("{")  # cut short
    with pytest.raises(RecipeError, match=r"(?s)no checkpoint can be read:\n  .*step-000002: controller\.json is "
                                          r"unreadable.*\n  .*step-000004: controller\.json is unreadable.*"
                                          r"--start-over"):
        resume_point(run)
    point = resume_point(run, start_over=True)
    assert point.checkpoint is None and len(point.skipped) == 2


def test_every_setting_changed_on_resume_is_listed_and_the_recorded_ones_are_not(tmp_path):
    _, run = _recorded_run(tmp_path)
    (run / "config.json").write_text(load_recipe(run / RECIPE_COPY, ["steps=2"]).config.model_dump_json())
    changed = load_recipe(run / RECIPE_COPY, ["steps=3", "trainer.lr=0.002", "faults.nodes.advantage=fail-fast"]).config
    assert check_changes(run, changed) == ["faults.nodes.advantage (unset) -> 'fail-fast'", "steps 2 -> 3",
                                           "trainer.lr 0.0003 -> 0.002"]


def test_resumed_metrics_do_not_repeat_steps_rates_count_only_new_work_and_keep_prunes_old(tmp_path):
    recipe, run = _run(tmp_path, "steps=4", "checkpoint.keep=3")
    shutil.rmtree(run / "checkpoints" / "step-000004")  # as if killed after step 4 trained, before its checkpoint
    resumed_at = json.loads((run / "checkpoints" / "step-000002" / "controller.json").read_text())["wall_s"]
    assert run_recipe(recipe, overrides=["steps=6", "checkpoint.keep=1"], resume=run, live=False) == 0
    steps = _records(run, "step")
    assert [s["version"] for s in steps] == list(range(1, 7))  # versions 3 and 4 once each, not twice
    resumed = [s for s in steps if s["version"] > 2]
    first = resumed[0]
    # one step's worth, not three: the rate is over the resumed process's own seconds (wall_s goes on from the
    # checkpoint's, so a run's lines stay one curve against time)
    assert first["samples_per_s"] * (first["wall_s"] - resumed_at) == pytest.approx(B * G)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000006"]


def test_a_cosine_schedule_resumed_with_other_steps_says_how_the_lr_of_its_version_jumps(tmp_path):
    from types import SimpleNamespace

    from areal.cli.run import _lr_moves

    tiny = Path(__file__).with_name("tiny_rl.py")
    cosine = ["trainer.lr_schedule=cosine", "trainer.warmup_steps=0"]
    (tmp_path / "config.json").write_text(load_recipe(tiny, [*cosine, "steps=4"]).config.model_dump_json())
    at_the_end = SimpleNamespace(run_dir=tmp_path, saved={"version": 4})  # where the 4-step schedule reached 0
    [said] = _lr_moves(load_recipe(tiny, [*cosine, "steps=8"]), at_the_end)
    assert said.endswith("tiny_rl.py:55: node 'actor' (ppo-update): its cosine lr schedule now ends at step 8, not 4: "
                         "the lr at version 4 goes from 0 to 0.0005")  # 1e-3 · (1 + cos(π · 4/8)) / 2
    assert _lr_moves(load_recipe(tiny, ["steps=8"]), at_the_end) == []  # a constant lr does not move

"""bench_math_learning: the answer the warm start teaches is read alike by both judges and by reasoning-gym,
the benchmark's recipe swaps the judge and nothing else, and (slow) the whole benchmark runs at tiny size."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from areal.graph.recipe import load_recipe
from areal.rewards.math.answer import MathReward
from tests.benchmarks.loading import load_benchmark

pytest.importorskip("math_verify")

judge_bench = load_benchmark("bench_math_judge")  # bench_math_learning imports it by name
bench = load_benchmark("bench_math_learning")
# answers of every shape the task has: negative, zero, one digit, two digits
ANSWERS = ["-8", "-1", "0", "7", "10", "18"]


@pytest.fixture(scope="module")
def old_dir(tmp_path_factory) -> Path:
    """The folder holding areal's checker before issue #35, read from git history as both math benchmarks read it."""
    if os.system(f"git -C {bench.ROOT} cat-file -e {judge_bench.OLD_CHECKER} 2>/dev/null") != 0:
        pytest.skip(f"the old checker is read from git history ({judge_bench.OLD_CHECKER}): a shallow clone lacks it")
    folder = tmp_path_factory.mktemp("old")
    judge_bench.old_checker(folder)
    return folder


@pytest.fixture(scope="module")
def old_reward(old_dir):
    with judge_bench.old_checker(old_dir).MathReward(timeout_s=10.0) as reward:
        yield reward


def test_the_taught_answer_is_rewarded_by_both_judges_and_a_neighbour_by_neither(old_reward):
    with MathReward(timeout_s=10.0) as new_reward:
        for answer in ANSWERS:
            prompt = f"Calculate 9 - 9.{bench.INSTRUCTION}"  # the prompt changes nothing for a bare number
            taught, neighbour = bench.solution(answer), bench.solution(str(int(answer) + 1))
            assert new_reward.score(taught, answer, prompt).reward == 1.0, answer
            assert old_reward.score(taught, answer).reward == 1.0, answer
            assert new_reward.score(neighbour, answer, prompt).reward == 0.0, answer
            assert old_reward.score(neighbour, answer).reward == 0.0, answer


def test_a_restated_question_is_paid_by_the_old_checker_alone(old_reward):
    task = {"task_id": "t", "prompt": f"Calculate 7 - 9.{bench.INSTRUCTION}", "answer": "-2"}
    restated = bench.restated(task)
    assert restated == "\\boxed{7 - 9}" and bench.boxed_answer(restated) == "7 - 9"
    assert old_reward.score(restated, "-2").reward == 1.0  # the reward hack --restate-every teaches
    with MathReward(timeout_s=10.0) as new_reward:
        assert new_reward.score(restated, "-2", task["prompt"]).reward == 0.0
    with pytest.raises(ValueError, match=re.escape("t: 'What is 7 - 9?' is not 'Calculate EXPRESSION.'")):
        bench.restated({**task, "prompt": "What is 7 - 9?"})


def test_the_answer_given_to_reasoning_gym_is_the_last_box_and_none_without_one():
    assert [bench.boxed_answer(bench.solution(a)) for a in ANSWERS] == ANSWERS
    assert bench.boxed_answer("\\boxed{3} no, \\boxed{ -4 }") == "-4"
    assert bench.boxed_answer("the answer is 4") is None
    assert bench.boxed_answer("\\boxed{4") is None  # a truncated box is no answer, as for both judges


@pytest.mark.eval  # needs the eval extra: python -m pytest -m eval
def test_reasoning_gym_scores_the_taught_answer_one_and_a_neighbour_zero_on_every_held_out_question():
    pytest.importorskip("reasoning_gym", reason="reasoning-gym tasks need the 'reasoning-gym' package (areal[eval])")
    from areal.data.reasoning_gym import create_dataset

    dataset = create_dataset(bench.TASK, bench.TASKS_GENERATED, 0, bench.OPTIONS)
    heldout = bench.tasks("test")
    assert heldout and not {t["prompt"] for t in heldout} & {t["prompt"] for t in bench.tasks("train")}
    for task in heldout:
        entry = dataset[task["rg"]["index"]]
        assert task["prompt"] == entry["question"] + bench.INSTRUCTION and task["answer"] == entry["answer"]
        assert dataset.score_answer(bench.boxed_answer(bench.solution(task["answer"])), entry) == 1.0
        assert dataset.score_answer(str(int(task["answer"]) + 1), entry) < 1.0


@pytest.mark.parametrize("judge", ["new", "old"])
def test_the_benchmark_recipe_is_the_math_recipe_with_only_the_judge_chosen(judge, old_dir, monkeypatch):
    monkeypatch.setenv("MATH_JUDGE", judge)
    monkeypatch.setenv("OLD_JUDGE_DIR", str(old_dir))
    ours, theirs = load_recipe(bench.RECIPE), load_recipe(bench.ROOT / "recipes" / "math_rl.py")
    assert ours.config == theirs.config and list(ours.graph.nodes) == list(theirs.graph.nodes)
    for name, node in theirs.graph.nodes.items():
        mine = ours.graph.nodes[name]
        assert (mine.kind, mine.pool, mine.where, mine.outputs) == (node.kind, node.pool, node.where, node.outputs)
        assert mine.inputs == node.inputs or (name, judge) == ("score", "old")  # the old judge never read the prompt
    fn = ours.graph.nodes["score"].spec.factory().fn
    if judge == "old":
        assert type(fn).__module__ == "old_math_answer" and fn.input_names == ("completion", "answer")
    else:  # the recipe's own reward, prompt and all
        assert type(fn).__module__ == "areal.rewards.math.answer"
        assert fn.input_names == ("completion", "answer", "prompt") and fn.timeout_s == 2.0


def test_the_benchmark_recipe_refuses_an_unknown_judge(monkeypatch):
    monkeypatch.setenv("MATH_JUDGE", "newest")
    with pytest.raises(Exception, match=r"MATH_JUDGE='newest': use new or old"):
        load_recipe(bench.RECIPE)


def test_the_table_reports_each_judge_by_each_scorer_on_both_question_sets_and_the_training_false_positives():
    def run(start: float, end: float, heldout_end: float, fp: int) -> dict:
        return {"start": dict.fromkeys(bench.SETS, dict.fromkeys(bench.SCORERS, start)),
                "end": {"trained": dict.fromkeys(bench.SCORERS, end),
                        "held-out": dict.fromkeys(bench.SCORERS, heldout_end)},
                "false_pos": fp, "wrong": 10, "trained": 16}

    lines = bench.table({"new": [run(0.2, 0.5, 0.2, 0), run(0.2, 0.3, 0.1, 0)],
                         "old": [run(0.2, 0.25, 0.2, 1), run(0.2, 0.25, 0.2, 2)]})
    assert lines[2] == ("| new judge | reasoning-gym | 0.200 | 0.400 | +0.200 ± 0.100 | 0.200 | 0.150 | -0.050 ± 0.050 "
                        "| 0/20 (0.0%) |")
    assert lines[5] == ("| old judge | reasoning-gym | 0.200 | 0.250 | +0.050 ± 0.000 | 0.200 | 0.200 | +0.000 ± 0.000 "
                        "| 3/20 (15.0%) |")
    # seed by seed: (0.3 - 0.05, 0.1 - 0.05) = (0.25, 0.05): mean 0.15, SE = 0.1414 / sqrt(2) = 0.1
    assert lines[-2].startswith("gain on the trained questions") and lines[-2].endswith("+0.150 ± 0.100")
    # held out: (0 - 0, -0.1 - 0): mean -0.05, SE 0.05
    assert lines[-1].startswith("gain on the held-out questions") and lines[-1].endswith("-0.050 ± 0.050")


@pytest.mark.slow  # minutes on 2 shared cores: a warm start and two `areal run`s
def test_the_benchmark_runs_end_to_end_at_tiny_size(tmp_path, monkeypatch, capsys):
    pytest.importorskip("reasoning_gym", reason="reasoning-gym tasks need the 'reasoning-gym' package (areal[eval])")
    monkeypatch.setenv("AREAL_CACHE", str(tmp_path / "cache"))
    bench.main(["--seeds", "1", "--steps", "2", "--train-questions", "4", "--heldout", "4", "--samples", "2",
                "--warmstart-steps", "8"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if re.match(r"\| (new|old) judge \|", line)]
    assert [r.split(" | ")[:2] for r in rows] == [[f"| {j} judge", s] for j in bench.JUDGES for s in bench.SCORERS]
    for row in rows:
        cells = row.split(" | ")
        assert all(0.0 <= float(cells[i]) <= 1.0 for i in (2, 3, 5, 6))
    # 2 steps x 8 groups x 8 samples trained per run, every one judged against reasoning-gym
    seen = [re.search(r"(\d+)/(\d+) \(", r) for r in rows if "reasoning-gym" in r]
    assert all(m and int(m.group(1)) <= int(m.group(2)) <= 128 for m in seen)
    assert "gain on the trained questions by reasoning-gym's checker, new judge minus old" in out
    assert "gain on the held-out questions by reasoning-gym's checker, new judge minus old" in out

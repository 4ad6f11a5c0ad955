"""`areal run` into a log file: a line per step at most every few seconds, each held-out round, each long call."""

from __future__ import annotations

import io
from types import SimpleNamespace

from rich.console import Console

from areal.cli.progress import ProgressLines
from areal.cli.run import run_recipe
from tests.runtime.test_run import RECIPE


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _controller(version: int, evals: list[dict], long_calls: list[str]) -> SimpleNamespace:
    step = {"reward_mean": 0.5, "samples_per_s": 40.0, "generated_tokens_per_s": 3500.0}
    state = SimpleNamespace(version=version, steps=10, last_step=step, evals=evals, long_calls=long_calls)
    return SimpleNamespace(state=state, _elapsed=lambda: 12.0)


def test_a_step_line_at_most_every_interval_and_each_round_and_long_call_once():
    clock = Clock()
    lines = ProgressLines(every_s=10.0, clock=clock)
    first = {"version": 0, "pass@1": 0.25, "pass@1_se": 0.01}
    assert lines.lines(_controller(0, [first], [])) == ["held-out pass@1 0.250 ± 0.010 at version 0"]
    assert lines.lines(_controller(1, [first], [])) == ["version 1/10 · 12 s · reward 0.500 · 40.0 samples/s · "
                                                         "3500 tokens/s"]
    clock.now = 9.0
    assert lines.lines(_controller(2, [first], ["score[0]: in a call for 400 s"])) == [
        "long node call: score[0]: in a call for 400 s"]  # the step waits for the interval
    clock.now = 10.0
    assert lines.lines(_controller(3, [first], ["score[0]: in a call for 400 s"]))[0].startswith("version 3/10")
    clock.now = 30.0
    assert lines.lines(_controller(3, [first], ["score[0]: in a call for 400 s"])) == []  # nothing new
    clock.now = 31.0
    assert lines.lines(_controller(4, [first], []), final=True)[0].startswith("version 4/10")  # the run's last


def test_a_run_into_a_file_prints_progress_lines_not_only_a_last_frame(tmp_path):
    recipe = tmp_path / "fake_rl.py"
    recipe.write_text(RECIPE.read_text())
    out = io.StringIO()
    assert run_recipe(recipe, overrides=["steps=3"], run_dir=tmp_path / "run", live=True,
                      console=Console(file=out, width=200)) == 0
    text = out.getvalue()
    assert "version 3/3 · " in text and "areal · fake-rl" not in text  # a line, not the live view's frame


def test_an_evals_progress_into_a_file_is_a_line_per_phase_now_and_then_and_one_at_its_end():
    from areal.cli.progress import progress_lines

    clock, out = Clock(), io.StringIO()
    report = progress_lines(Console(file=out, width=200), every_s=30.0, clock=clock)
    for done, now in ((0, 0.0), (10, 5.0), (40, 31.0), (64, 40.0), (64, 41.0)):
        clock.now = now
        report("generate", done, 64)
    clock.now = 50.0
    report("judge", 0, 64)
    assert out.getvalue().splitlines() == ["generate 0/64 (0%) · 0 s", "generate 40/64 (62%) · 31 s",
                                           "generate 64/64 (100%) · 40 s", "judge 0/64 (0%) · 50 s"]

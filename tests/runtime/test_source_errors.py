"""A task source's own exception (a store gone away, a bug in its code) stops the run as a run error naming the
source node and the frames of its code, for the training tasks and the held-out ones alike: not a traceback
through the controller."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from areal.cli.run import build_controller
from areal.errors import RunError

FAKE_RL = Path(__file__).with_name("fake_rl.py")


def _recipe(tmp_path: Path, train_at: int, heldout_at: int | None) -> Path:
    text = FAKE_RL.read_text()
    heldout = f"StoreGone({heldout_at})" if heldout_at is not None else "HELDOUT"
    text = text.replace('g.source("tasks", Counting(), heldout=HELDOUT)',
                        f'g.source("tasks", StoreGone({train_at}), heldout={heldout})')
    text = text.replace("\nconfig = RunConfig(", '''

class StoreGone:
    fields = ("prompt",)

    def __init__(self, at):
        self.at = at

    def __iter__(self):
        for i in range(self.at):
            yield {"prompt": f"p{i}"}
        raise OSError("the task store went away")


config = RunConfig(''', 1)
    recipe = tmp_path / "fake_rl.py"
    recipe.write_text(text)
    return recipe


def test_a_training_source_that_raises_stops_the_run_naming_it_and_its_code(tmp_path):
    controller = build_controller(_recipe(tmp_path, train_at=10, heldout_at=None), ["steps=100"], tmp_path / "run")
    with pytest.raises(RunError) as raised:
        controller.run()
    said = str(raised.value)
    assert re.search(r"fake_rl\.py:\d+: node 'tasks' \(source\): the task source raised OSError: the task store "
                     "went away", said)
    assert 'fake_rl.py", line' in said and "in __iter__" in said and "admission.py" not in said
    assert 0 < controller.state.version < 100  # it trained on what the source gave before it broke
    assert all(w.process.poll() is not None for w in controller.workers.values())


def test_a_held_out_source_that_raises_is_refused_before_the_run_starts(tmp_path):
    with pytest.raises(RunError, match=r"^the held-out task source: the task source raised OSError: the task store "
                                       r"went away\n  File .*fake_rl\.py\", line \d+, in __iter__"):
        build_controller(_recipe(tmp_path, train_at=10, heldout_at=3), ["steps=2", "eval.tasks=5"], tmp_path / "run")

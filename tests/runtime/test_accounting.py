"""Accounting of generations that go wrong but train on: over-long and empty outputs are counted."""

from __future__ import annotations

import json
from pathlib import Path

from areal.runtime.accounting import Accounting
from areal.runtime.launch import build_controller
from tests.local_model import make_checkpoint

TINY_RL = Path(__file__).with_name("tiny_rl.py")


def test_a_regenerated_sample_is_noted_once():
    accounting = Accounting(batch_size=1, group_size=2)
    accounting.on_noted([0, 1], ["over_long", "empty"])
    accounting.on_noted([1], ["empty"])
    summary = accounting.summary(version=0)
    assert (summary["over_long"], summary["empty"]) == (1, 1)


def test_one_token_generations_are_each_counted_over_long_or_empty_and_the_run_goes_on(tmp_path):
    # with one token, a generation either hits max_new_tokens or is eos / whitespace alone
    controller = build_controller(TINY_RL, [f"model={make_checkpoint(tmp_path / 'ckpt')}", "steps=2",
                                            "generation.max_new_tokens=1"], tmp_path / "run")
    state = controller.run()
    assert state.version == 2
    summary = controller.accounting.summary(state.version)
    assert summary["trained"] == 2 * 2 * 3 and summary["over_long"] > 0
    assert summary["over_long"] + summary["empty"] == summary["trained"]
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if '"step"' in line]
    assert (steps[-1]["over_long"], steps[-1]["empty"]) == (summary["over_long"], summary["empty"])

"""trainer.epochs and trainer.ratio in real runs: one version a step whatever the passes, the clip acting only where a
second pass over the batch has moved π_θ off the π_prox its proximal pass took, and GSPO's per-sample ratio."""

from __future__ import annotations

import json
from pathlib import Path

from areal.cli.run import build_controller
from tests.local_model import make_checkpoint

TINY_RL = Path(__file__).with_name("tiny_rl.py")


def test_a_second_pass_over_each_batch_is_where_the_clip_acts_and_the_versions_stay_one_a_step(tmp_path):
    model = make_checkpoint(tmp_path / "ckpt")
    steps = {}
    for epochs in (1, 2):
        run = tmp_path / f"run-{epochs}"
        build_controller(TINY_RL, [f"model={model}", "trainer.lr=0.05", "trainer.warmup_steps=0",
                                   f"trainer.epochs={epochs}"], run).run()
        steps[epochs] = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
                         if '"kind": "step"' in line]
    assert [s["version"] for s in steps[1]] == [s["version"] for s in steps[2]] == [1, 2, 3, 4]
    assert all(s["clip_fraction"] == 0.0 for s in steps[1])  # one pass: π_θ is π_prox at its only step
    assert any(s["clip_fraction"] > 0.05 for s in steps[2]), [s["clip_fraction"] for s in steps[2]]


def test_a_run_with_gspos_sequence_ratio_and_its_narrow_range_clips_in_its_second_pass(tmp_path):
    model = make_checkpoint(tmp_path / "ckpt")
    run = tmp_path / "run"
    build_controller(TINY_RL, [f"model={model}", "trainer.lr=0.05", "trainer.warmup_steps=0", "trainer.epochs=2",
                               "trainer.ratio=sequence", "trainer.clip_eps=3e-4", "trainer.clip_eps_high=4e-4",
                               "trainer.loss_agg=seq-mean-token-mean"], run).run()
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"kind": "step"' in line]
    assert [s["version"] for s in steps] == [1, 2, 3, 4]
    assert any(s["clip_fraction"] > 0.05 for s in steps), [s["clip_fraction"] for s in steps]

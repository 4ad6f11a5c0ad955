"""Real runs of recipes/emulated_rl.py: the emulated engines keep every runtime invariant.

The whole runtime runs around them (source, staleness gate, reward pool, joins, trainer batches,
weights publication, checkpoints); what the trainer reports training is recorded by wrapping the
controller's handler of its "version" messages, independently of the controller's own accounting.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from areal.cli.run import build_controller
from areal.engines.emulated.device import PROFILES
from areal.runtime.controller import controller as controller_module
from areal.runtime.storage.resume import resume_point
from areal.runtime.wire import messages as msg

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "emulated_rl.py"
B, G = 2, 4
# short outputs on a fast clock: a run is a few seconds after the workers start
SMALL = [f"batch_size={B}", f"group_size={G}", "emulation.time_scale=0.05", "emulation.output_tokens_median=48",
         "emulation.output_tokens_sigma=1.0", "generation.max_new_tokens=256", "generation.max_batch=32"]


@pytest.fixture
def reported(monkeypatch):
    """Every step the trainer reported: (version it trained, its sample ids, its staleness histogram)."""
    steps: list[tuple[int, list[int], dict[int, int]]] = []
    original = controller_module.HANDLERS[msg.VersionPublished]

    def record(self, worker, m):
        steps.append((m.version - 1, list(m.sample_ids), {int(k): v for k, v in m.staleness.items()}))
        original(self, worker, m)

    monkeypatch.setitem(controller_module.HANDLERS, msg.VersionPublished, record)
    return steps


def _ids(steps) -> list[int]:
    return [sid for _, ids, _ in steps for sid in ids]


def test_an_emulated_async_run_trains_every_sample_once_within_eta(tmp_path, reported):
    # a device profile whose updates take 0.5 s: generation runs ahead of training, up to the bound
    profile = json.loads((PROFILES / "h100-qwen2.5-1.5b.json").read_text()) | {"train_step_s": 0.5}
    (tmp_path / "slow-trainer.json").write_text(json.dumps(profile))
    controller = build_controller(RECIPE, [*SMALL, "steps=8", "staleness=1",
                                           f"emulation.profile={tmp_path / 'slow-trainer.json'}"], tmp_path / "run")
    state = controller.run()
    ids = _ids(reported)
    assert state.version == 8 and [v for v, _, _ in reported] == list(range(8))
    assert sorted(ids) == list(range(8 * B * G))  # exactly once, by sample id
    lags = sum((Counter(h) for _, _, h in reported), Counter())
    assert max(lags) == 1 and sum(lags.values()) == 8 * B * G  # the slack was used, and never exceeded
    assert dict(state.staleness) == dict(lags)
    summary = controller.accounting.summary()
    assert summary["trained"] == 8 * B * G and summary["failed"] == summary["duplicates_dropped"] == 0
    assert summary["started"] == summary["trained"] + summary["in_flight"]
    assert summary["over_long"] > 0  # the long tail reached max_new_tokens and was counted, not lost


def test_an_emulated_sync_run_samples_every_token_from_the_version_it_trains(tmp_path, reported):
    controller = build_controller(RECIPE, [*SMALL, "steps=4", "mode=sync"], tmp_path / "run")
    controller.run()
    assert [h for _, _, h in reported] == [{0: B * G}] * 4


@pytest.mark.slow  # two runs, each starting its workers: ~25 s here
def test_an_emulated_run_resumes_from_its_checkpoint_without_repeating_or_skipping(tmp_path, reported):
    run = tmp_path / "run"
    build_controller(RECIPE, [*SMALL, "steps=3", "checkpoint.interval_steps=2"], run).run()
    first = list(reported)
    point = resume_point(run)
    assert point.checkpoint is not None and point.checkpoint.name == "step-000003"
    resumed = build_controller(point.recipe, [*point.overrides, "steps=6"], run, point)
    state = resumed.run()
    second = reported[len(first):]
    assert [v for v, _, _ in second] == [3, 4, 5] and state.version == 6
    ids = _ids(first) + _ids(second)
    assert sorted(ids) == list(range(6 * B * G))
    assert resumed.accounting.summary()["trained"] == 6 * B * G

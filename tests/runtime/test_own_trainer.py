"""A trainer of the researcher's own is held to the staleness bound exactly as ppo_update is, though its node
declares no `versions` port: the runtime checks η, records each sample's lag and, under the token policy, masks
the tokens older than η, all from the versions the generator stamped (own_trainer_rl.py records what it was given,
policy_rl.py's advantage what arrived)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal.cli.run import build_controller
from areal.errors import ConfigError
from areal.runtime.records.sample_records import read_samples
from tests.runtime.test_staleness_policies import ETA, arrived

RECIPE = Path(__file__).with_name("own_trainer_rl.py")


def trained(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "trained.jsonl").read_text().splitlines()]


def test_a_trainer_without_a_versions_port_gets_the_lags_the_check_and_the_token_mask(tmp_path, reported):
    controller = build_controller(RECIPE, ["staleness_policy=token", f"staleness={ETA}", "steps=8",
                                           "emulation.time_scale=1.0", "emulation.output_tokens_median=24"],
                                  tmp_path / "run")
    state = controller.run()
    assert state.version == 8
    versions = arrived(controller)
    steps = trained(tmp_path / "run")
    assert all(s["ports"] == ["advantage", "group_id", "loss_mask", "output_ids", "sample_id"] for s in steps)
    older = 0
    for step in steps:  # the mask it was given is exactly "not older than η", token by token
        for sid, mask in zip(step["sample_ids"], step["masks"]):
            expected = [int(v >= step["version"] - ETA) for v in versions[sid]]
            assert mask == expected, sid
            older += expected.count(0)
    assert older > 0 and sum(stats["masked_tokens"] for _, _, stats in reported) == older
    records = read_samples(tmp_path / "run")
    lags = {sid: step["version"] - min(versions[sid]) for step in steps for sid in step["sample_ids"]}
    assert max(lags.values()) > ETA  # stragglers were trained, their old tokens masked
    assert {sid: records[sid].lag for sid in lags} == lags
    histogram = {}
    for _, _, stats in reported:
        assert stats["stale_tokens"] == 0
    for lag in lags.values():
        histogram[lag] = histogram.get(lag, 0) + 1
    assert dict(state.staleness) == histogram


def test_a_masking_policy_is_refused_for_a_trainer_that_reads_no_loss_mask(tmp_path):
    recipe = tmp_path / "own_trainer_rl.py"
    recipe.write_text(RECIPE.read_text().replace(', "loss_mask": Int32["S", "T"]}', "}")
                      .replace(', optional={"loss_mask"}', ""))
    with pytest.raises(ConfigError, match=r"staleness_policy=token: .*node 'actor' \(custom\) has no `loss_mask` "
                                          r"input, so the tokens older than η this policy masks would still be "
                                          r"trained"):
        build_controller(recipe, ["staleness_policy=token"], tmp_path / "run")

"""Accounting of generations that go wrong but train on: over-long and empty outputs are counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal.cli.run import build_controller
from areal.errors import RunError
from areal.runtime.controller.accounting import Accounting
from tests.local_model import make_checkpoint

TINY_RL = Path(__file__).with_name("tiny_rl.py")


def test_a_regenerated_sample_is_noted_once():
    accounting = Accounting(group_size=2)
    accounting.on_noted([0, 1], ["over_long", "empty"])
    accounting.on_noted([1], ["empty"])
    summary = accounting.summary()
    assert (summary["over_long"], summary["empty"]) == (1, 1)


def test_one_token_generations_are_each_counted_over_long_or_empty_and_the_run_goes_on(tmp_path):
    # with one token, a generation either hits max_new_tokens or is eos / whitespace alone
    controller = build_controller(TINY_RL, [f"model={make_checkpoint(tmp_path / 'ckpt')}", "steps=2",
                                            "generation.max_new_tokens=1"], tmp_path / "run")
    state = controller.run()
    assert state.version == 2
    summary = controller.accounting.summary()
    assert summary["trained"] == 2 * 2 * 3 and summary["over_long"] > 0
    assert summary["over_long"] + summary["empty"] == summary["trained"]
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if '"step"' in line]
    assert (steps[-1]["over_long"], steps[-1]["empty"]) == (summary["over_long"], summary["empty"])


def test_a_group_whose_every_sample_failed_or_was_filtered_frees_its_slot_once():
    accounting = Accounting(group_size=2, counted="actor", started_groups=3)
    assert accounting.on_failed([2], ["reward: nan"]) == []  # group 1 still has sample 3
    assert accounting.on_filtered([3], ["dapo: all rewards equal"]) == [1]
    accounting.on_trained("actor", [0, 1])
    accounting.on_trained("critic", [4])  # another trainer's samples are not counted twice
    accounting.check(version=1, groups=[0, 1], now=0.0, grace_s=10.0)
    assert accounting.awaiting == {}
    summary = accounting.summary()
    assert (summary["trained"], summary["failed"], summary["filtered"], summary["in_flight"]) == (2, 1, 1, 2)


def test_dropped_samples_close_the_identity_with_their_wasted_tokens_and_free_their_group_once():
    accounting = Accounting(group_size=2, counted="actor", started_groups=3)
    accounting.on_trained("actor", [0, 1])
    assert accounting.on_dropped([2, 3], [40, 7], "rollout: aborted in generation") == [1]
    accounting.on_dropped([2, 3], [40, 7], "actor: older than η")  # a re-issued copy: its tokens counted once
    accounting.on_failed([3], ["reward: nan"])  # a late failure report does not make it failed too
    accounting.check(version=1, groups=[0, 1], now=0.0, grace_s=10.0)
    summary = accounting.summary()
    assert (summary["trained"], summary["dropped"], summary["dropped_tokens"], summary["failed"]) == (2, 2, 47, 0)
    assert summary["started"] == summary["trained"] + summary["dropped"] + summary["in_flight"] == 6


def test_a_consumed_group_with_a_sample_nowhere_breaks_the_check_naming_it():
    accounting = Accounting(group_size=2, counted="actor", started_groups=1)
    accounting.on_trained("actor", [0])
    accounting.check(version=1, groups=[0], now=100.0, grace_s=10.0)  # sample 1's report may still be on its way
    accounting.overdue(now=110.0, grace_s=10.0)
    with pytest.raises(RunError, match=r"accounting broken at version 1: 1 samples of consumed groups .* "
                                       r"10 s later \(first: \[1\]\)"):
        accounting.overdue(now=110.5, grace_s=10.0)


def test_a_failure_report_that_arrives_after_its_trainers_version_resolves_the_sample():
    """The report and the version come from two workers' sockets: the controller may read the version first."""
    accounting = Accounting(group_size=2, counted="actor", started_groups=2)
    accounting.on_trained("actor", [0, 2])
    accounting.check(version=1, groups=[0, 1], now=0.0, grace_s=10.0)
    assert sorted(accounting.awaiting) == [1, 3]
    accounting.on_failed([1], ["advantage: output 'advantage' is nan"])
    accounting.on_filtered([3], ["dapo: all rewards equal"])
    accounting.overdue(now=60.0, grace_s=10.0)  # nothing waits any more
    assert accounting.summary()["in_flight"] == 0


def test_a_sample_counted_both_trained_and_failed_breaks_the_check_at_once():
    accounting = Accounting(group_size=1, counted="actor", started_groups=1)
    accounting.on_failed([0], ["reward: nan"])
    accounting.trained.add(0)  # what on_trained never does: it takes a trained sample out of the failed ones
    with pytest.raises(RunError, match="1 samples counted both trained and failed, filtered or dropped"):
        accounting.check(version=1, groups=[0], now=0.0, grace_s=10.0)


def test_a_lost_group_frees_its_slot_once_whatever_reports_its_copies_bring():
    """A re-issued copy of a group the filter dropped is dropped again, and one whose samples failed fails again:
    the gate must free the group's slot once, not once per report."""
    accounting = Accounting(group_size=2, counted="actor", started_groups=3)
    assert accounting.on_filtered([0, 1], ["dapo: all equal"] * 2) == [0]
    assert accounting.on_filtered([0, 1], ["dapo: all equal"] * 2) == []  # the re-issued copy, filtered again
    assert accounting.on_failed([2], ["reward: nan"]) == []
    assert accounting.on_failed([3], ["reward: nan"]) == [1]
    assert accounting.on_failed([2, 3], ["reward: nan"] * 2) == []  # the copy's samples fail again
    assert accounting.on_filtered([3], ["dapo: all equal"]) == []  # or another node drops what is left of it
    assert accounting.lost == {0, 1}

"""Each staleness policy's pieces on tiny literal steps: the order groups train in, the mask, and the check that
names a broken guarantee from the recorded token versions (runtime/policies)."""

from __future__ import annotations

import typing

import pytest
import torch

from areal.config import RunConfig
from areal.errors import RunError
from areal.graph.batch import Batch, Ragged
from areal.graph.meta import GroupMeta
from areal.runtime.staleness.policies import POLICIES, policy_named
from areal.runtime.staleness.policies.enforce import checked_step, expired, with_policy_mask
from areal.runtime.staleness.policies.policy import in_admission_order, oldest_finished


def view(versions: list[list[int]], groups: list[int], loss_mask: list[list[int]] | None = None) -> Batch:
    """What a trainer's update reads: per sample, each output token's version (and an episode's own mask)."""
    fields = {"versions": Ragged.from_rows([torch.tensor(v, dtype=torch.int32) for v in versions]),
              "group_id": torch.tensor(groups), "sample_id": torch.arange(len(groups))}
    if loss_mask is not None:
        fields["loss_mask"] = Ragged.from_rows([torch.tensor(m, dtype=torch.int32) for m in loss_mask])
    return Batch(fields)


def metas(*groups: tuple[int, ...]) -> list[GroupMeta]:
    """(group, admitted at, slot[, the generator's last stamp])"""
    return [GroupMeta(group=g[0], samples=1, admitted_at=g[1], slot=g[2], stamped_at=g[3] if len(g) > 3 else None)
            for g in groups]


def test_every_setting_value_names_a_policy_in_the_table():
    assert set(typing.get_args(RunConfig.model_fields["staleness_policy"].annotation)) == set(POLICIES)


def test_admission_order_waits_for_the_next_group_and_skips_the_consumed_and_the_empty():
    waiting = {5: 3, 6: 0, 8: 3, 9: 3}  # group -> samples left: 6 lost every sample
    assert in_admission_order(waiting, 5, consumed={7}, per_step=2) == [5, 6, 8]  # 7 was trained already
    assert in_admission_order(waiting, 5, consumed=set(), per_step=2) == []  # 7 has not arrived: the step waits


def test_oldest_finished_takes_the_lowest_arrived_groups_and_never_waits_for_a_straggler():
    waiting = {9: 3, 4: 3, 7: 0, 12: 3}  # 5, 6, 8 still generating
    assert oldest_finished(waiting, per_step=2) == [4, 7, 9]  # the empty one goes with the step
    assert oldest_finished(waiting, per_step=4) == []


def test_strict_and_drop_refuse_a_trained_sample_more_than_eta_behind():
    fine, late = view([[3, 4], [5]], [0, 1]), view([[2, 5], [5]], [0, 1])  # step 5, η 2: version 2 is 3 behind
    for name in ("strict", "drop"):
        assert checked_step(POLICIES[name], fine, 5, 2, 1, metas())["staleness"] == {2: 1, 0: 1}
        with pytest.raises(RunError, match=rf"version 5 \(staleness_policy={name}\): lags \{{0: 1, 3: 1\}} exceed η=2"):
            checked_step(POLICIES[name], late, 5, 2, 1, metas())


def test_admission_accepts_any_lag_but_refuses_a_group_admitted_past_the_gate():
    # B = 2, η = 1: at version 3 slots 0 .. (3 + 1 + 1)·2 - 1 = 9 are open
    late = view([[3, 3, 6]], [4])
    numbers = checked_step(POLICIES["admission"], late, 7, 1, 2, metas((4, 3, 9)))
    assert numbers == {"staleness": {4: 1}, "stale_tokens": 2}  # lag 4, and its two tokens older than η counted
    with pytest.raises(RunError, match="group 4 was admitted at version 3 into slot 10, past the gate's"):
        checked_step(POLICIES["admission"], late, 7, 1, 2, metas((4, 3, 10)))
    with pytest.raises(RunError, match="holds a token of version 0, older than its admission at version 3"):
        checked_step(POLICIES["admission"], view([[0]], [4]), 4, 1, 2, metas((4, 3, 1)))
    with pytest.raises(RunError, match="a sample of group 5 came with no admission record"):
        checked_step(POLICIES["admission"], view([[3]], [5]), 4, 1, 2, metas((4, 3, 1)))


def test_token_masks_exactly_the_tokens_older_than_eta_beside_an_episodes_own_mask():
    # step 6, η 2: versions 3 are 3 behind; the episode's tool token (mask 0) is not counted as masked by the policy
    before = view([[3, 3, 4, 6], [6, 6]], [0, 1], loss_mask=[[1, 0, 1, 1], [1, 1]])
    masked, count = with_policy_mask(before, 6, 2)
    assert [m.tolist() for m in masked["loss_mask"].rows()] == [[0, 0, 1, 1], [1, 1]] and count == 1
    assert checked_step(POLICIES["token"], masked, 6, 2, 1, metas())["stale_tokens"] == 0
    with pytest.raises(RunError, match="1 token the loss reads is more than η = 2 versions behind"):
        checked_step(POLICIES["token"], before, 6, 2, 1, metas())
    with pytest.raises(RunError, match="2 tokens the loss reads are more than η = 1 version behind"):
        checked_step(POLICIES["token"], before, 6, 1, 1, metas())


def test_a_group_expires_when_one_token_is_older_than_eta_at_the_coming_step():
    versions = Ragged.from_rows([torch.tensor([4, 5], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)])
    assert not expired(versions, 5, 2) and expired(versions, 6, 2)
    assert not expired(Ragged.from_rows([torch.zeros(0, dtype=torch.int32)]), 9, 2)  # no token: nothing old


def test_the_gate_label_names_the_policy_and_what_it_bounds():
    from areal.runtime.compiler.plan import Plan

    plan = Plan("g", "r.py", (), "run", (), (), (), "ipc://c", (), "w", 10, 1, 1, staleness=2,
                staleness_policy="token")
    assert plan.gate_bound() == "η=2 (async, token): ≤ 2 versions ahead; every trained token ≤ 2 versions behind; " \
        "older ones masked"
    assert "staleness_policy=token" in plan.bounds()


def test_recycle_masks_like_token_and_refuses_a_token_sampled_more_than_eta_after_its_groups_stamp():
    # step 6, η 2: group 0 started at 1, re-queued at 4 (its tokens since: 4 .. 6); its versions 1 and 3 are masked
    masked, count = with_policy_mask(view([[1, 3, 4, 6]], [0]), 6, 2)
    assert count == 2
    assert checked_step(POLICIES["recycle"], masked, 6, 2, 2, metas((0, 1, 0, 4))) == {"staleness": {5: 1},
                                                                                         "stale_tokens": 0}
    with pytest.raises(RunError, match="holds a token of version 6, more than η=2 after its group's last stamp at "
                                       "version 3: it was not re-queued"):
        checked_step(POLICIES["recycle"], masked, 6, 2, 2, metas((0, 1, 0, 3)))
    with pytest.raises(RunError, match="1 token the loss reads is more than η = 2 versions behind"):
        checked_step(POLICIES["recycle"], view([[3, 6]], [0]), 6, 2, 2, metas((0, 1, 0, 4)))
    with pytest.raises(RunError, match="group 0 came with no generator's stamp"):
        checked_step(POLICIES["recycle"], masked, 6, 2, 2, metas((0, 1, 0)))


def test_recycle_keeping_its_prefix_trains_the_old_tokens_and_checks_admission_and_the_stamp():
    keeping = policy_named("recycle", recycle_keep_prefix=True)
    assert keeping is not POLICIES["recycle"] and not keeping.masks and keeping.recycles
    unmasked = view([[1, 3, 4, 6]], [0])
    numbers = checked_step(keeping, unmasked, 6, 2, 2, metas((0, 1, 0, 4)))
    assert numbers == {"staleness": {5: 1}, "stale_tokens": 2}  # versions 1 and 3 trained past η, and counted
    with pytest.raises(RunError, match="holds a token of version 1, older than its admission at version 2"):
        checked_step(keeping, unmasked, 6, 2, 2, metas((0, 2, 0, 4)))
    with pytest.raises(RunError, match="more than η=2 after its group's last stamp at version 1"):
        checked_step(keeping, unmasked, 6, 2, 2, metas((0, 1, 0, 1)))


def test_keeping_the_prefix_is_refused_without_recycle():
    with pytest.raises(ValueError, match="recycle_keep_prefix=true needs staleness_policy=recycle, not token"):
        RunConfig(staleness_policy="token", recycle_keep_prefix=True)
    assert policy_named("token", recycle_keep_prefix=False) is POLICIES["token"]


def test_a_sample_with_no_tokens_has_lag_zero_beside_others_read_from_the_packed_versions():
    # step 6, η 2: sample 1 (versions 3 and 6) is 3 behind, sample 0 has no output token, sample 2 is current
    steps = view([[], [3, 6], [6]], [0, 0, 1])
    masked, count = with_policy_mask(steps, 6, 2)
    assert count == 1 and [m.tolist() for m in masked["loss_mask"].rows()] == [[], [0, 1], [1]]
    numbers = checked_step(POLICIES["recycle"], masked, 6, 2, 2, metas((0, 3, 0, 4), (1, 4, 1, 4)))
    assert numbers == {"staleness": {0: 2, 3: 1}, "stale_tokens": 0}


def test_drop_slack_admits_that_many_groups_past_the_gate_and_is_refused_under_any_other_policy():
    from areal.runtime.compiler.plan import Plan
    from areal.runtime.staleness.gate import StalenessGate

    def started_at_version_0(slack: int) -> int:
        gate = StalenessGate(batch_size=4, staleness=2, slack=slack)
        while gate.try_start(0):
            pass
        return gate.started

    assert started_at_version_0(0) == 12 and started_at_version_0(5) == 17  # (η + 1)·B, then 5 more
    gate = StalenessGate(batch_size=4, staleness=2, started=17, slack=5)
    assert gate.capacity(0) == 0 and gate.capacity(1) == 4  # the bound moves on by B a version, slack and all
    gate.free()
    assert gate.capacity(0) == 1  # a dropped group's slot starts another, as without slack
    with pytest.raises(ValueError, match="drop_slack=3 needs staleness_policy=drop, not admission"):
        RunConfig(staleness_policy="admission", drop_slack=3)
    plan = Plan("g", "r.py", (), "run", (), (), (), "ipc://c", (), "w", 10, 1, 1, staleness=2,
                staleness_policy="drop", drop_slack=5)
    assert plan.gate_bound().startswith("η=2 (async, drop): ≤ 2 versions + 5 groups ahead; every trained sample")

"""The mismatch alarm's arithmetic: which tokens it compares (lag 0 only; whole samples under keep-kv; never an
episode's tool tokens), the numbers a step records, and the message that stops a run: the generator, the version
and the gap. Real runs with a generator that skips a weight update are in test_lora_runs.py."""

from __future__ import annotations

import math

import pytest
import torch

from areal.config import RunConfig
from areal.errors import RunError, WireError
from areal.graph.batch import Batch, Ragged
from areal.graph.meta import GroupMeta
from areal.runtime.worker.mismatch import DEFAULT_TOLERANCE, checked, tolerance


def _view(versions, behav, prox, groups, loss_mask=None) -> Batch:
    fields = {"versions": Ragged.from_rows([torch.tensor(v, dtype=torch.int32) for v in versions]),
              "behav_logp": Ragged.from_rows([torch.tensor(b, dtype=torch.float32) for b in behav]),
              "prox_logp": Ragged.from_rows([torch.tensor(p, dtype=torch.float32) for p in prox]),
              "group_id": torch.tensor(groups), "sample_id": torch.arange(len(groups))}
    if loss_mask is not None:
        fields["loss_mask"] = Ragged.from_rows([torch.tensor(m, dtype=torch.int32) for m in loss_mask])
    return Batch(fields)


# sample 0 (group 0, rollout[0]): tokens at versions 6, 7, 7 with gaps 0.5, 1e-6, 3e-6
# sample 1 (group 1, rollout[1]): tokens at version 7, gaps 0.25 and 0.0
VIEW = _view(versions=[[6, 7, 7], [7, 7]], behav=[[-1.0, -2.0, -3.0], [-0.5, -0.7]],
             prox=[[-1.5, -2.000001, -3.000003], [-0.75, -0.7]], groups=[0, 1])
WHO = {0: "rollout[0]", 1: "rollout[1]"}


def test_only_tokens_at_the_trainers_version_are_compared_and_the_worst_generator_is_named():
    with pytest.raises(RunError, match=r"generator rollout\[1\] is not sampling version 7: 1 of its 2 tokens stamped "
                                       r"version 7 .* by up to 0\.25 nats \(trainer\.lag0_tolerance=0\.01\)"):
        checked(VIEW, 7, WHO, whole_samples=False, limit=0.01)
    # rollout[0]'s 0.5 is at version 6 (lag 1): the trainer has no π_6 to compare it with
    numbers = checked(VIEW, 7, WHO, whole_samples=False, limit=0.3)
    assert numbers["lag0_tokens"] == 4 and numbers["lag0_over"] == 0
    assert numbers["lag0_gap_max"] == pytest.approx(0.25)


def test_under_keep_kv_a_sample_that_crossed_a_weight_update_is_left_out():
    numbers = checked(VIEW, 7, WHO, whole_samples=True, limit=0.3)
    assert numbers["lag0_tokens"] == 2  # sample 0 began at version 6: its later tokens read version 6's KV


def test_an_episodes_tool_tokens_are_never_compared():
    view = _view(versions=[[7, 7]], behav=[[0.0, -1.0]], prox=[[-3.0, -1.0]], groups=[0], loss_mask=[[0, 1]])
    assert checked(view, 7, WHO, whole_samples=False, limit=0.01) == {"lag0_gap_max": 0.0, "lag0_tokens": 1.0,
                                                                       "lag0_over": 0.0}


def test_a_step_without_lag0_tokens_records_none_and_stops_nothing():
    assert checked(VIEW, 9, WHO, whole_samples=False, limit=1e-9) == {"lag0_gap_max": 0.0, "lag0_tokens": 0.0,
                                                                       "lag0_over": 0.0}


def test_a_generator_of_several_groups_is_judged_on_all_its_tokens_and_an_unstamped_group_is_a_generator():
    # groups 0 and 2 are rollout[0]'s: its worst gap (0.4) is in group 2, and 2 of its 4 lag-0 tokens are past 0.1;
    # group 1 has no stamp; rollout[1]'s group 3 has a smaller worst gap (0.3). Unstamped, groups 0-2 are one
    view = _view(versions=[[7, 7], [7], [7, 7], [7]], behav=[[0.0, 0.2], [0.0], [0.4, 0.0], [0.3]],
                 prox=[[0.0, 0.0], [0.05], [0.0, 0.0], [0.0]], groups=[0, 1, 2, 3])
    with pytest.raises(RunError, match=r"generator rollout\[0\] is not sampling version 7: 2 of its 4 tokens .* "
                                       r"by up to 0\.4 nats"):
        checked(view, 7, {0: "rollout[0]", 2: "rollout[0]", 3: "rollout[1]"}, whole_samples=False, limit=0.1)
    with pytest.raises(RunError, match=r"generator a generator is not sampling version 7: 3 of its 5 tokens"):
        checked(view, 7, {3: "rollout[1]"}, whole_samples=False, limit=0.01)


def test_the_tolerance_is_the_setting_else_the_dtypes_and_inf_turns_the_alarm_off():
    assert tolerance(RunConfig()) == DEFAULT_TOLERANCE["float32"]
    assert tolerance(RunConfig(dtype="bfloat16")) == DEFAULT_TOLERANCE["bfloat16"]
    assert tolerance(RunConfig(trainer={"lag0_tolerance": 0.05})) == 0.05
    assert tolerance(RunConfig(trainer={"lag0_tolerance": math.inf})) is None
    # vLLM renormalises its processed log-probs over the nucleus: with top_p < 1 they are not π's
    assert tolerance(RunConfig(generation={"engine": "vllm", "top_p": 0.9})) is None


def test_the_generator_stamp_crosses_the_wire_and_a_malformed_one_is_refused():
    meta = GroupMeta(group=3, samples=2, admitted_at=1, sampled_by="rollout[1]")
    assert GroupMeta.from_wire(meta.to_wire(), "'rollout'") == meta
    with pytest.raises(WireError, match="meta 'sampled_by' must be a worker id"):
        GroupMeta.from_wire({**meta.to_wire(), "sampled_by": 5}, "'rollout'")

"""A group's prompt computed once a row: the units found, and the trainer's log-probs and gradients those of each
sequence alone, in float64."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor

from areal.config import RunConfig
from areal.engines import MicroBatch, TorchTrainEngine, train_settings
from areal.engines.training.trainer_settings import TrainSettings
from areal.errors import ConfigError
from areal.kernels.packing import PackingError
from areal.kernels.shared_prefix import MIN_SHARED_TOKENS, prefix_units, row_positions, shares_prefixes, unit_length
from areal.overrides import apply_overrides

# (prompt length, output lengths of its group's members); the last two prompts stand alone
GROUPS = [(12, [1, 5, 9, 3]), (20, [7, 2, 2, 6]), (9, [4, 8, 1, 5]), (15, [6]), (4, [3])]


def grouped_batch(seed: int = 0) -> tuple[list[Tensor], list[int], list[list[int]]]:
    """Sequences whose groups share their prompt; each member's output starts with a token of its own, so a
    group's common prefix is exactly its prompt. Returns the sequences, their prompt lengths, the groups."""
    g = torch.Generator().manual_seed(seed)
    seqs, prompts, groups = [], [], []
    for prompt_len, outputs in GROUPS:
        prompt = torch.randint(0, 100, (prompt_len,), generator=g)
        members = []
        for k, n in enumerate(outputs):
            output = torch.randint(0, 100, (n,), generator=g)
            output[0] = 90 + k  # distinct first output tokens within the group
            members.append(len(seqs))
            seqs.append(torch.cat([prompt, output]))
            prompts.append(prompt_len)
        groups.append(members)
    return seqs, prompts, groups


def test_a_groups_prompt_makes_one_unit_and_a_short_or_lone_prefix_none():
    seqs, prompts, groups = grouped_batch()
    units = prefix_units(seqs, range(len(seqs)), max_tokens=10_000)
    found = {tuple(sorted(members)): shared for shared, members in units}
    for members in groups:
        shared = prompts[members[0]] if len(members) > 1 else len(seqs[members[0]])
        assert found[tuple(members)] == shared
    assert sorted(i for _, members in units for i in members) == list(range(len(seqs)))
    # a common prefix under MIN_SHARED_TOKENS is not worth a mask: each sequence alone
    short = [torch.tensor([1] * (MIN_SHARED_TOKENS - 1) + [k, 5, 6]) for k in (2, 3)]
    assert prefix_units(short, [0, 1], 10_000) == [(10, [0]), (10, [1])]


def test_a_group_over_the_budget_is_split_and_a_sequence_over_it_is_named():
    seqs, _, groups = grouped_batch()
    budget = 24  # the 12-token prompt with outputs of 1, 5, 9, 3: 30 positions as one row
    units = prefix_units(seqs, groups[0], budget)
    assert len(units) > 1 and all(unit_length(seqs, u) <= budget for u in units)
    assert sorted(i for _, m in units for i in m) == sorted(groups[0])
    with pytest.raises(PackingError, match=f"sequence 5 has {len(seqs[5])} tokens"):
        prefix_units(seqs, [5], max_tokens=len(seqs[5]) - 1)


def loss(logp: Tensor, mb: MicroBatch) -> tuple[Tensor, dict]:
    return -(mb["advantage"] * logp).mean(), {}


def reference(model64: torch.nn.Module, seq: Tensor, start: int) -> Tensor:
    """float64 log π of tokens start..L-1 of one sequence, from its own forward."""
    logp = torch.log_softmax(model64(seq[None]).logits[0], dim=-1)
    return logp[start - 1 : -1].gather(1, seq[start:, None]).squeeze(1)


@pytest.fixture
def norm_in_float64(monkeypatch):
    """Hugging Face's RMS norm computes in float32 even in a float64 model, and its backward rounds the gradients
    it passes to float32: a shared row sums the members' gradients in another order than their own rows do, so
    the check of that sum needs the norm in the model's dtype (then the two agree to 1e-16)."""
    from transformers.models.qwen2 import modeling_qwen2

    def forward(self, hidden_states: Tensor) -> Tensor:
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    monkeypatch.setattr(modeling_qwen2.Qwen2RMSNorm, "forward", forward)


@pytest.mark.usefixtures("norm_in_float64")
@pytest.mark.parametrize("keep", [False, True], ids=["own forward", "kept forward"])
def test_shared_rows_give_each_sequences_own_logprobs_and_gradients_in_float64(make_model, keep):
    model = make_model(0).double()
    seqs, prompts, _ = grouped_batch()
    g = torch.Generator().manual_seed(1)
    advantage = [torch.randn(len(s) - p, generator=g, dtype=torch.float64) for s, p in zip(seqs, prompts, strict=True)]
    engine = TorchTrainEngine(copy.deepcopy(model), TrainSettings(lr=1e-3, grad_clip=None, microbatch_tokens=64))
    assert engine.shared_prefixes
    # the rows hold fewer positions than the sequences: each group's prompt once
    assert row_positions(seqs, engine._microbatches(seqs)) < sum(len(s) for s in seqs)
    got = engine.sequence_logprobs(seqs, no_grad=not keep, keep_for_update=keep)
    with torch.no_grad():
        for s, logp in zip(seqs, got, strict=True):
            torch.testing.assert_close(logp.detach().double(), reference(model, s, 1), atol=1e-10, rtol=0)
    stats = engine.train_step(seqs, prompts, loss, {"advantage": advantage})
    assert stats["reused_forward"] == float(keep)
    terms = [a * reference(model, s, p) for a, s, p in zip(advantage, seqs, prompts, strict=True)]
    (-torch.cat(terms).mean()).backward()
    for (name, p), p64 in zip(engine.model.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, p64.grad, atol=1e-10, rtol=1e-8, msg=name)


def test_plain_rows_where_the_attention_or_the_setting_says_so(make_model):
    model = make_model(0)
    assert shares_prefixes(model)
    assert not TorchTrainEngine(copy.deepcopy(model), TrainSettings(shared_prefixes=False)).shared_prefixes
    model.config._attn_implementation = "flash_attention_2"  # takes no 4D mask: the rows would see each other
    assert not shares_prefixes(model)


def test_groups_whose_prompts_share_only_a_template_stay_apart():
    """Two groups of 4 whose prompts share their first 10 tokens: one row each, not one row sharing the 10
    (which would hold more positions, and a longer row's attention costs its length squared)."""
    template = torch.arange(10)
    seqs = []
    for question in (torch.arange(50, 70), torch.arange(70, 90)):
        for k in range(4):
            seqs.append(torch.cat([template, question, torch.tensor([95 - k, 3, 4])]))
    units = prefix_units(seqs, range(len(seqs)), max_tokens=10_000)
    assert sorted((shared, sorted(members)) for shared, members in units) == [(30, [0, 1, 2, 3]), (30, [4, 5, 6, 7])]


def test_long_outputs_still_share_their_prompt():
    """Outputs much longer than the prompt: the row still holds the prompt once (fewer positions than apart)."""
    prompt = torch.arange(20)
    seqs = [torch.cat([prompt, torch.full((100,), 50 + k)]) for k in range(4)]
    assert prefix_units(seqs, range(4), max_tokens=10_000) == [(20, [0, 1, 2, 3])]


@pytest.mark.parametrize(("setting", "device", "shared"), [
    ([], "cpu", True), ([], "cuda", False),  # auto: where it was measured to pay
    (["trainer.shared_prefixes=on"], "cuda", True), (["trainer.shared_prefixes=off"], "cpu", False),
    (["trainer.shared_prefixes=true"], "cuda", True), (["trainer.shared_prefixes=false"], "cpu", False),
])
def test_the_run_setting_shares_prompts_on_the_cpu_by_default_and_as_told_anywhere(setting, device, shared):
    config = apply_overrides(RunConfig(), [*setting, f"trainer.device={device}"])
    assert train_settings(config).shared_prefixes is shared


def test_a_shared_prefixes_setting_that_is_no_switch_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"trainer\.shared_prefixes"):
        apply_overrides(RunConfig(), ["trainer.shared_prefixes=sometimes"])

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import Tensor

from areal.engines import MicroBatch, TorchTrainEngine
from areal.engines.training.torch_train import CALL_COST_TOKENS, NonFiniteUpdate
from areal.engines.training.trainer_settings import TrainSettings
from areal.graph.batch import Ragged
from areal.kernels.packing import padded_microbatches

LENGTHS = [(2, 5), (4, 12), (1, 17), (3, 4), (5, 9), (6, 20)]  # (prompt_len, total length)


def batch(seed: int = 0) -> tuple[list[Tensor], list[int], dict]:
    """Random sequences, their prompt lengths, a per-token advantage and a per-sample scale."""
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(0, 100, (n,), generator=g) for _, n in LENGTHS]
    prompts = [p for p, _ in LENGTHS]
    advantage = [torch.randn(n - p, generator=g) for p, n in LENGTHS]
    scale = torch.rand(len(LENGTHS), generator=g) + 0.5
    return seqs, prompts, {"advantage": advantage, "scale": scale}


def pg_loss_mean(logp: Tensor, mb: MicroBatch) -> tuple[Tensor, dict]:
    """A policy-gradient-shaped loss using a per-token and a per-sample extra field."""
    per_token = -mb.per_token(mb["scale"]) * mb["advantage"] * logp
    return per_token.mean(), {"logp": logp.detach().mean()}


def pg_loss_sum(logp: Tensor, mb: MicroBatch) -> tuple[Tensor, dict]:
    return (-mb.per_token(mb["scale"]) * mb["advantage"] * logp).sum(), {}


def reference_output_logp(model64: torch.nn.Module, seq: Tensor, start: int, temperature: float) -> Tensor:
    """float64 log π of tokens start..L-1 of one sequence, from its own unpadded forward."""
    logits = model64(seq[None]).logits[0]
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp[start - 1 : -1].gather(1, seq[start:, None]).squeeze(1)


def assert_the_float64_step(model: torch.nn.Module, engine: TorchTrainEngine, stats: dict, seqs: list[Tensor],
                            prompts: list[int]) -> None:
    """The engine's one step from `model` took pg_loss's token-weighted mean over the batch: its loss, grad
    norm and gradients are those of a float64 copy running each sequence alone."""
    model64 = copy.deepcopy(model).double()
    _, _, ref_extra = batch()
    terms = [
        -ref_extra["scale"][i].double() * ref_extra["advantage"][i].double() * reference_output_logp(model64, s, p, 1.0)
        for i, (s, p) in enumerate(zip(seqs, prompts, strict=True))
    ]
    ref_loss = torch.cat(terms).mean()  # the token-weighted mean over every output token of the batch
    ref_loss.backward()
    assert stats["loss"] == pytest.approx(float(ref_loss.detach()), abs=1e-6)
    assert stats["tokens"] == sum(n - p for p, n in LENGTHS)
    assert stats["grad_norm"] == pytest.approx(
        math.sqrt(sum(float(p.grad.square().sum()) for p in model64.parameters())), rel=1e-5
    )
    for (name, p), p64 in zip(engine.model.named_parameters(), model64.parameters(), strict=True):
        torch.testing.assert_close(p.grad.double(), p64.grad, atol=1e-6, rtol=1e-4, msg=name)


def test_sequence_logprobs_equal_a_float64_reference_across_microbatches(make_model):
    model = make_model(0)
    seqs, _, _ = batch()
    engine = TorchTrainEngine(model, TrainSettings(microbatch_tokens=24, temperature=0.7))
    got = engine.sequence_logprobs(seqs)
    model64 = copy.deepcopy(model).double()
    with torch.no_grad():
        for s, logp in zip(seqs, got, strict=True):
            assert logp.shape == (len(s) - 1,) and not logp.requires_grad
            torch.testing.assert_close(logp.double(), reference_output_logp(model64, s, 1, 0.7), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("microbatch_tokens", "loss_fn", "reduction"),
    [(10_000, pg_loss_mean, "mean"), (24, pg_loss_mean, "mean"), (24, pg_loss_sum, "sum")],
)
def test_train_step_gradient_is_the_token_weighted_mean_for_any_microbatch_split(
    make_model, microbatch_tokens, loss_fn, reduction
):
    model = make_model(0)
    seqs, prompts, extra = batch()
    extra["advantage"] = Ragged.from_rows(extra["advantage"]) if reduction == "sum" else extra["advantage"]
    engine = TorchTrainEngine(copy.deepcopy(model), TrainSettings(lr=1e-3, grad_clip=None,
                                                                   microbatch_tokens=microbatch_tokens))
    stats = engine.train_step(seqs, prompts, loss_fn, extra, loss_reduction=reduction)
    assert stats["reused_forward"] == 0.0  # no kept forward: its own
    plan = padded_microbatches([len(s) for s in seqs], microbatch_tokens, CALL_COST_TOKENS)
    assert stats["microbatches"] == len(plan) and (len(plan) == 1) == (microbatch_tokens > 100)

    assert_the_float64_step(model, engine, stats, seqs, prompts)
    assert engine.step == 1


def count_forwards(engine: TorchTrainEngine) -> list[int]:
    calls: list[int] = []
    engine.model.register_forward_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize(("loss_fn", "reduction"), [(pg_loss_mean, "mean"), (pg_loss_sum, "sum")])
def test_an_update_after_a_kept_forward_backpropagates_through_it_as_its_own_forward_would(make_model, loss_fn,
                                                                                          reduction):
    model = make_model(0)
    seqs, prompts, extra = batch()
    engine = TorchTrainEngine(copy.deepcopy(model), TrainSettings(lr=1e-3, grad_clip=None, microbatch_tokens=24))
    kept = engine.sequence_logprobs([s.clone() for s in seqs], keep_for_update=True)  # equal, not the same tensors
    assert all(not lp.requires_grad for lp in kept)  # what leaves the engine is plain values
    fresh = TorchTrainEngine(copy.deepcopy(model), TrainSettings(microbatch_tokens=24)).sequence_logprobs(seqs)
    assert all(torch.equal(a, b) for a, b in zip(kept, fresh, strict=True))
    forwards = count_forwards(engine)
    stats = engine.train_step(seqs, prompts, loss_fn, extra, loss_reduction=reduction)
    assert stats["reused_forward"] == 1.0 and stats["microbatches"] > 1 and not forwards
    assert_the_float64_step(model, engine, stats, seqs, prompts)


@pytest.mark.parametrize("between", ["other sequences", "new weights", "a step"])
def test_a_kept_forward_serves_only_the_next_step_over_the_same_sequences_and_weights(make_model, between):
    seqs, prompts, extra = batch()
    engine = TorchTrainEngine(make_model(0), TrainSettings(lr=1e-3, grad_clip=None, microbatch_tokens=24))
    engine.sequence_logprobs(seqs, keep_for_update=True)
    if between == "other sequences":
        seqs[2] = seqs[2].flip(0)
    elif between == "new weights":
        engine.load_state_dict(make_model(1).state_dict())
    else:
        assert engine.train_step(seqs, prompts, pg_loss_mean, extra)["reused_forward"] == 1.0
    before = copy.deepcopy(engine.model)
    forwards = count_forwards(engine)
    stats = engine.train_step(seqs, prompts, pg_loss_mean, extra)
    assert stats["reused_forward"] == 0.0 and len(forwards) == stats["microbatches"]
    assert_the_float64_step(before, engine, stats, seqs, prompts)


def test_checkpoint_round_trip_restores_outputs_and_the_next_step(make_model, tmp_path):
    settings = TrainSettings(
        lr=1e-3, weight_decay=0.1, microbatch_tokens=24, warmup_steps=2, lr_schedule="cosine", total_steps=6
    )
    seqs, prompts, extra = batch(0)
    first = TorchTrainEngine(make_model(0), settings)
    first.train_step(seqs, prompts, pg_loss_mean, extra)
    first.save(tmp_path / "ckpt", version=7)
    assert sorted(p.name for p in (tmp_path / "ckpt").rglob("*") if p.is_file()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "optimizer.safetensors",
        "rng.safetensors",
        "trainer_state.json",
    ]

    second = TorchTrainEngine(make_model(1), settings)
    assert second.load(tmp_path / "ckpt") == 7  # the version the caller recorded
    assert second.step == 1
    for a, b in zip(first.sequence_logprobs(seqs), second.sequence_logprobs(seqs), strict=True):
        assert torch.equal(a, b)

    seqs2, prompts2, extra2 = batch(1)
    stats = [e.train_step(seqs2, prompts2, pg_loss_mean, extra2) for e in (first, second)]
    assert stats[0]["loss"] == stats[1]["loss"] and stats[0]["lr"] == stats[1]["lr"] == settings.lr_at(1)
    for (name, a), b in zip(first.model.named_parameters(), second.model.parameters(), strict=True):
        assert torch.equal(a, b), name


def with_dropout(model: torch.nn.Module, p: float = 0.5) -> torch.nn.Module:
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = p
    return model


def test_the_models_own_dropout_stays_out_of_the_update_unless_asked(make_model):
    """The behaviour and proximal log-probs are taken without dropout: the update's gradient is that forward's
    (float64's), so a step's ratio to its own weights is 1; with model_dropout the draws change the step."""
    model = with_dropout(make_model(0)).eval()
    seqs, prompts, extra = batch()
    engine = TorchTrainEngine(copy.deepcopy(model), TrainSettings(lr=1e-3, grad_clip=None))
    assert_the_float64_step(model, engine, engine.train_step(seqs, prompts, pg_loss_mean, extra), seqs, prompts)

    losses = set()
    for seed in (1, 2):
        torch.manual_seed(seed)
        engine = TorchTrainEngine(copy.deepcopy(model), TrainSettings(lr=1e-3, model_dropout=True))
        losses.add(engine.train_step(seqs, prompts, pg_loss_mean, extra)["loss"])
    assert len(losses) == 2


def test_checkpoint_restores_the_rng_so_dropout_draws_continue_the_same(make_model, tmp_path):
    models = [with_dropout(make_model(0)), with_dropout(make_model(0))]
    first, second = (TorchTrainEngine(m, TrainSettings(lr=1e-3, model_dropout=True)) for m in models)
    (seqs, prompts, extra), (seqs2, prompts2, extra2) = batch(0), batch(1)
    first.train_step(seqs, prompts, pg_loss_mean, extra)
    first.save(tmp_path / "ckpt", version=1)
    first.train_step(seqs2, prompts2, pg_loss_mean, extra2)
    torch.manual_seed(123)  # a fresh process's RNG is elsewhere
    second.load(tmp_path / "ckpt")
    second.train_step(seqs2, prompts2, pg_loss_mean, extra2)
    for (name, a), b in zip(first.model.named_parameters(), second.model.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_lr_warms_up_linearly_then_follows_a_cosine_to_zero():
    settings = TrainSettings(lr=1.0, warmup_steps=2, lr_schedule="cosine", total_steps=6)
    # warmup: (k+1)/2; then 0.5 (1 + cos(pi (k-2)/4)) for k = 2..6
    expected = [0.5, 1.0, 1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4)), 0.0]
    assert [settings.lr_at(k) for k in range(7)] == pytest.approx(expected, abs=1e-12)
    with pytest.raises(ValueError, match="lr_schedule='cosine' needs total_steps"):
        TrainSettings(lr_schedule="cosine")


def test_extra_fields_of_the_wrong_length_are_refused_with_their_name(make_model):
    engine = TorchTrainEngine(make_model(0))
    seqs, prompts, extra = batch()
    extra["advantage"][2] = extra["advantage"][2][:-1]
    with pytest.raises(ValueError, match=r"extra\['advantage'\] row 2 has 15 values but sequence 2 has 16 output"):
        engine.train_step(seqs, prompts, pg_loss_mean, extra)
    with pytest.raises(ValueError, match=r"extra\['scale'\] is a Tensor, read as per-sample"):
        engine.train_step(seqs, prompts, pg_loss_mean, {"scale": torch.ones(3)})


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_a_non_finite_loss_is_refused_before_the_step_and_leaves_the_weights_and_step_as_they_were(make_model, poison):
    engine = TorchTrainEngine(make_model(0), TrainSettings(lr=1e-3))
    seqs, prompts, extra = batch(0)
    engine.train_step(seqs, prompts, pg_loss_mean, extra)  # a healthy step first: the optimizer has moments
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}

    def poisoned(logp: Tensor, mb: MicroBatch) -> tuple[Tensor, dict]:
        loss, stats = pg_loss_mean(logp, mb)
        return loss * poison, stats

    with pytest.raises(NonFiniteUpdate, match=r"optimizer step 1: the loss is (nan|inf) .* not applied"):
        engine.train_step(seqs, prompts, poisoned, extra)
    assert engine.step == 1
    assert all(torch.equal(before[k], v) for k, v in engine.model.state_dict().items())
    assert all(p.grad is None for p in engine.model.parameters())  # nothing left for the next step
    engine.train_step(seqs, prompts, pg_loss_mean, extra)  # and the next healthy step works
    assert all(torch.isfinite(v).all() for v in engine.model.state_dict().values())

"""The emulated engines: modelled time from the profile, valid tokens, interruptible generation, checkpoints."""

from __future__ import annotations

import json
import time

import pytest
import torch

from areal.engines.emulated.device import (
    ByteTokenizer,
    DeviceProfile,
    ModelledClock,
    OutputLengths,
    token_logprobs,
)
from areal.engines.emulated.generate import EmulatedGenerationEngine
from areal.engines.emulated.train import EmulatedTrainEngine
from areal.engines.generation import GenRequest
from areal.errors import ConfigError

PROFILE = DeviceProfile.load("h100-qwen2.5-1.5b")


def _engine(median: int = 16, sigma: float = 0.0, max_batch: int = 8, limit: int = 64, scale: float = 0.0,
            **kw) -> EmulatedGenerationEngine:
    return EmulatedGenerationEngine(PROFILE, lengths=OutputLengths(median, sigma, seed=1), max_new_tokens=limit,
                                    max_batch=max_batch, time_scale=scale, **kw)


def _requests(ids, prompt_len: int = 5) -> list[GenRequest]:
    return [GenRequest(request_id=i, prompt_ids=list(range(40, 40 + prompt_len))) for i in ids]


def test_the_default_profile_names_a_source_for_every_figure():
    timed = {k for k in vars(PROFILE) if k.endswith("_s")}
    assert timed <= dict(PROFILE.sources).keys()
    assert "H100" in PROFILE.device and "1.5B" in PROFILE.model


def test_a_profile_with_an_unknown_or_negative_figure_is_refused(tmp_path):
    raw = {k: v for k, v in vars(PROFILE).items() if k != "sources"}
    (tmp_path / "bad.json").write_text(json.dumps({**raw, "decode_step_s": -1, "typo_s": 1}))
    with pytest.raises(ConfigError, match=r"bad\.json: unknown keys \['typo_s'\]"):
        DeviceProfile.load(str(tmp_path / "bad.json"))
    (tmp_path / "neg.json").write_text(json.dumps({**raw, "decode_step_s": -1}))
    with pytest.raises(ConfigError, match="decode_step_s must be finite numbers >= 0"):
        DeviceProfile.load(str(tmp_path / "neg.json"))
    with pytest.raises(ConfigError, match="no such profile.*built-in: h100-qwen2.5-1.5b"):
        DeviceProfile.load("a100-nothing")


@pytest.mark.parametrize("batch,context", [(1, 10), (64, 40_000), (256, 1_000_000)])
def test_decode_steps_within_is_the_most_steps_whose_cost_fits(batch, context):
    budget = 0.05
    k = PROFILE.decode_steps_within(batch, context, budget)
    assert PROFILE.decode_s(batch, context, k) <= budget < PROFILE.decode_s(batch, context, k + 1)


def test_a_batch_costs_its_prefill_and_its_decode_steps():
    # 4 prompts of 5 tokens, 16 output tokens each: one prefill (which samples token 1) and 15 decode steps
    engine = _engine(median=16)
    results = engine.generate(_requests(range(4)))
    expected = PROFILE.prefill_s(4 * 5) + PROFILE.decode_s(4, 4 * 6, 15)
    assert engine.clock.modelled_s == pytest.approx(expected)
    assert [len(r.output_ids) for r in results] == [16] * 4


def test_outputs_are_valid_tokens_ending_in_eos_unless_capped():
    engine = _engine(median=40, sigma=1.0, limit=48)
    results = engine.generate(_requests(range(50)))
    tok = ByteTokenizer()
    for r in results:
        body = r.output_ids if r.finish_reason == "length" else r.output_ids[:-1]
        assert ((body >= tok.SAMPLED[0]) & (body < tok.SAMPLED[1])).all()
        assert (r.output_ids[-1] == tok.eos_token_id) == (r.finish_reason == "eos")
        assert len(r.output_ids) <= 48 and r.logprobs.shape == r.output_ids.shape
        assert bool((r.logprobs < 0).all()) and r.versions.dtype == torch.int32
    lengths = [len(r.output_ids) for r in results]
    assert "length" in {r.finish_reason for r in results} and min(lengths) < 30  # a spread, and a capped tail


def test_a_regenerated_sample_is_the_same_sample_whatever_its_batch():
    alone = _engine(sigma=1.0).generate(_requests([7]))[0]
    crowded = {r.request_id: r for r in _engine(sigma=1.0, max_batch=3).generate(_requests([3, 7, 11, 12]))}[7]
    assert torch.equal(alone.output_ids, crowded.output_ids) and torch.equal(alone.logprobs, crowded.logprobs)


def test_continuous_batching_runs_at_most_max_batch_and_refills_freed_slots():
    engine = _engine(median=4, max_batch=2)
    engine.generate(_requests(range(5)))
    # two rounds of two sequences, then the last one alone: each a prefill (token 1) and 3 decode steps
    pair, last = PROFILE.prefill_s(10) + PROFILE.decode_s(2, 12, 3), PROFILE.prefill_s(5) + PROFILE.decode_s(1, 6, 3)
    rounds = [pair, pair, last]
    assert engine.clock.modelled_s == pytest.approx(sum(rounds))


@pytest.mark.parametrize("keep_kv", [False, True])
def test_new_weights_split_a_running_sequence_and_charge_a_re_prefill_unless_the_kv_is_kept(keep_kv):
    engine = _engine(median=30, max_batch=4, keep_kv_on_update=keep_kv)
    engine.submit(_requests(range(2)))
    engine.step()  # prefill and at least one decode step at version 0
    before = dict(engine.modelled_s)
    context = sum(s.context for s in engine._active)
    engine.update_weights({}, version=1)
    results = []
    while engine.pending():
        results += engine.step()
    assert engine.modelled_s["weights"] == PROFILE.weights_load_s
    reread = 0.0 if keep_kv else PROFILE.prefill_s(context)
    assert engine.modelled_s["rebuild"] - before["rebuild"] == pytest.approx(reread)
    assert engine.modelled_s["prefill"] == before["prefill"]  # the re-read is charged apart from newcomers
    for r in results:
        versions = r.versions.tolist()
        assert versions == sorted(versions) and set(versions) == {0, 1}  # old tokens keep their version


def test_an_aborted_request_stops_where_it_is_and_the_others_finish_as_they_would_have():
    engine = _engine(median=30, max_batch=2, scale=1e-6, quantum_s=1e-12)  # one decode step per step()
    engine.submit(_requests(range(3)))  # 0 and 1 run, 2 waits
    engine.step()
    progress = engine.progress()
    assert set(progress) == {0, 1} and all(version == 0 for _, version in progress.values())
    assert engine.abort([1, 2, 99]) == {1: progress[1][0], 2: 0}  # what each had sampled; an unknown id is no-op
    results = []
    while engine.pending():
        results += engine.step()
    alone = _engine(median=30).generate(_requests([0]))[0]
    assert [r.request_id for r in results] == [0] and torch.equal(results[0].output_ids, alone.output_ids)


def test_a_requeued_sequence_goes_ahead_of_the_queue_pays_a_prefill_of_its_context_and_keeps_its_versions():
    engine = _engine(median=30, max_batch=1, scale=1e-6, quantum_s=1e-12)  # one decode step per step()
    engine.submit(_requests(range(2)))  # 0 runs, 1 waits
    engine.step()
    engine.step()
    held = engine.progress()[0][0]
    engine.update_weights({}, version=1)
    assert engine.requeue([0, 1]) == {0: held}  # only a running sequence moves
    before = dict(engine.modelled_s)
    engine.step()  # 0 takes the slot back, ahead of 1: a prefill of its prompt and its output so far
    assert [s.request_id for s in engine._active] == [0]
    context = len(engine._active[0].prompt) + held
    assert engine.modelled_s["prefill"] - before["prefill"] == pytest.approx(PROFILE.prefill_s(context))
    results = []
    while engine.pending():
        results += engine.step()
    first, second = results
    alone = _engine(median=30).generate(_requests([0]))[0]
    assert (first.request_id, second.request_id) == (0, 1) and torch.equal(first.output_ids, alone.output_ids)
    assert first.versions.tolist() == [0] * held + [1] * (len(alone.output_ids) - held)


def test_the_clock_pays_modelled_time_in_real_time_at_the_time_scale():
    clock = ModelledClock(time_scale=0.5)
    start = time.perf_counter()
    clock.spend(0.1)
    clock.spend(0.1)
    assert time.perf_counter() - start >= 0.1 and clock.modelled_s == pytest.approx(0.2)


def test_the_trainer_sees_the_generators_log_probabilities():
    result = _engine(median=12).generate(_requests([5], prompt_len=7))[0]
    sequence = torch.cat([result.prompt_ids, result.output_ids])
    trainer = EmulatedTrainEngine(PROFILE, time_scale=0.0)
    logp = trainer.sequence_logprobs([sequence])[0][len(result.prompt_ids) - 1 :]
    assert torch.equal(logp, result.logprobs)
    assert torch.equal(token_logprobs(result.output_ids, torch.arange(7, 7 + 12)), result.logprobs)


def test_the_trainer_gives_each_sequence_of_a_batch_its_own_log_probabilities():
    results = _engine(median=9, sigma=0.8).generate(_requests([1, 2, 3], prompt_len=4))
    sequences = [torch.cat([r.prompt_ids, r.output_ids]) for r in results]
    assert len({len(s) for s in sequences}) > 1  # rows of different lengths: the split must follow each
    trainer = EmulatedTrainEngine(PROFILE, time_scale=0.0)
    together = trainer.sequence_logprobs(sequences)
    for sequence, result, logp in zip(sequences, results, together, strict=True):
        assert torch.equal(logp, trainer.sequence_logprobs([sequence])[0])
        assert torch.equal(logp[len(result.prompt_ids) - 1 :], result.logprobs)
    assert trainer.sequence_logprobs([]) == []


def test_an_update_runs_the_loss_and_costs_its_tokens():
    trainer = EmulatedTrainEngine(PROFILE, time_scale=0.0, gpus_per_rank=2)
    sequences = [torch.arange(40, 50), torch.arange(40, 46)]
    seen = {}

    def loss_fn(logp, mb):
        seen["n"], seen["adv"] = logp.numel(), mb.per_token(mb["advantage"]).tolist()
        return logp.mean(), {"clip_fraction": 0.0}

    stats = trainer.train_step(sequences, [4, 2], loss_fn, {"advantage": torch.tensor([1.0, -1.0])})
    assert seen == {"n": 10, "adv": [1.0] * 6 + [-1.0] * 4}
    assert stats["tokens"] == 10 and trainer.step == 1
    assert trainer.modelled_s["train"] == pytest.approx(PROFILE.train_s(16 / 2) + PROFILE.train_sync_s)


def test_a_checkpoint_restores_the_step_and_refuses_another_engines(tmp_path):
    trainer = EmulatedTrainEngine(PROFILE, time_scale=0.0)
    trainer.step = 7
    trainer.save(tmp_path / "t", version=5)
    other = EmulatedTrainEngine(PROFILE, time_scale=0.0)
    assert other.load(tmp_path / "t") == 5 and other.step == 7
    (tmp_path / "t" / "trainer_state.json").write_text(json.dumps({"format": 1, "step": 1, "version": 1}))
    with pytest.raises(ValueError, match="a checkpoint of a real engine cannot resume an emulated one"):
        other.load(tmp_path / "t")


def test_the_byte_tokenizer_round_trips_text():
    tok = ByteTokenizer()
    ids = tok.encode("x = 1 + 2")
    assert ids[0] == tok.bos_token_id and tok.decode(ids) == "x = 1 + 2"


def test_log_normal_lengths_have_a_long_tail_and_sigma_0_is_fixed():
    lengths = OutputLengths(100, 1.0, seed=0)
    draws = sorted(lengths.draw(i, 10**6) for i in range(2000))
    assert 90 <= draws[1000] <= 110 and draws[-100] > 400  # median ~100; 1 in 20 beyond ~5x
    assert {OutputLengths(100, 0.0).draw(i, 64) for i in range(10)} == {64}

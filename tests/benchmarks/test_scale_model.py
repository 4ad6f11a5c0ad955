"""The zero-overhead schedule model behind bench_scale's ideal under η: checked against a closed form."""

from __future__ import annotations

import pytest

from areal.engines.emulated.device import DeviceProfile, OutputLengths
from tests.benchmarks.loading import load_benchmark

model = load_benchmark("scale_model")
PROFILE = DeviceProfile.load("h100-qwen2.5-1.5b")


def schedule(generators: int = 1, *, sigma: float = 0.0, staleness: int = 2, groups_per_generator: int = 2,
             group_size: int = 8, steps: int = 20, prompts: tuple[int, ...] = (60,), policy: str = "strict",
             max_batch: int = 128) -> object:
    return model.Schedule(PROFILE, OutputLengths(256, sigma, seed=0), prompts, generators,
                          groups_per_generator * generators, group_size, staleness, steps, max_batch=max_batch,
                          max_new_tokens=8192, trainer_gpus=generators, policy=policy)


def test_a_synchronous_one_sequence_run_steps_by_the_sum_of_its_phases():
    """η = 0, one sample a step: each step generates it (after taking the last version's weights, but the
    first), trains it and publishes, one after the other."""
    s = schedule(staleness=0, groups_per_generator=1, group_size=1, steps=4)
    p, prompt, output = PROFILE, 60, 256
    generate = p.prefill_s(prompt) + p.decode_s(1, prompt + 1, output - 1)  # the prefill samples token 1
    train = p.logprob_s(prompt + output) + p.train_s(prompt + output) + p.weights_publish_s
    times = model.step_times(s)
    assert times[0] == pytest.approx(generate + train, rel=1e-9)
    for a, b in zip(times, times[1:]):
        assert b - a == pytest.approx(p.weights_load_s + generate + train, rel=1e-9)


def test_without_a_tail_the_rate_scales_with_the_generators():
    """Two generators and up: the trainer's per-step reduction is the same for every N (one has none)."""
    two = model.samples_per_s(schedule(2))
    assert model.samples_per_s(schedule(8)) == pytest.approx(4 * two, rel=1e-9)


def test_a_long_tail_costs_more_as_the_batch_grows_and_a_looser_bound_wins_part_of_it_back():
    """A step waits for the longest of B·G outputs: more generators, a larger B, a longer wait per sample."""
    one = model.samples_per_s(schedule(1, sigma=1.0))
    tight = model.samples_per_s(schedule(16, sigma=1.0))
    loose = model.samples_per_s(schedule(16, sigma=1.0, staleness=8))
    assert tight < 0.7 * 16 * one
    assert loose > 2 * tight


def test_the_model_runs_the_steps_asked_and_a_rate_needs_two():
    """bench_scale divides by the span from the first step record to the last: one record has no span."""
    s = schedule(4, sigma=1.0, staleness=1, steps=5)
    times = model.step_times(s)
    assert len(times) == 5 and times == sorted(times)
    with pytest.raises(ValueError, match="at least 2 steps"):
        model.samples_per_s(schedule(steps=1))


def test_each_policy_keeps_its_guarantee_and_pays_its_own_price():
    """σ = 1: stragglers. strict and drop train nothing past η; token trains past η but masks every older token;
    admission trains them; drop wastes what it aborts and trains shorter outputs than it draws."""
    out = {policy: model.simulate(schedule(4, sigma=1.0, staleness=1, steps=30, policy=policy))
           for policy in model.POLICIES}
    for policy in ("strict", "drop"):
        assert max(out[policy].lags) <= 1 and out[policy].stale_tokens == out[policy].masked_tokens == 0
    for policy in ("token", "recycle"):
        assert max(out[policy].lags) > 1 and out[policy].masked_tokens > 0 and out[policy].stale_tokens == 0
    assert max(out["admission"].lags) > 1 and out["admission"].stale_tokens > 0 == out["admission"].masked_tokens
    assert out["drop"].dropped_groups > 0 and out["drop"].wasted() > 0 and out["drop"].length_ratio() < 0.97
    assert out["recycle"].recycled_groups > 0
    rate = {p: o.samples_per_s(8 * 8) for p, o in out.items()}
    assert min(rate["admission"], rate["token"], rate["drop"]) > 1.2 * rate["strict"]


def test_recycle_with_a_full_queue_readmits_its_late_groups_first_and_masks_no_more_than_token():
    """8 slots for the 96 samples a generator holds (η = 2, 4 groups of 8 per generator a step): a re-queued
    sample goes ahead of the newer ones, so re-queueing costs nothing the weight update does not. At the back of
    the queue it waited while its tokens aged past η: 2.7 times the masked tokens of token, lags to 10 (not 5)."""
    out = {policy: model.simulate(schedule(4, sigma=1.0, staleness=2, groups_per_generator=4, steps=30,
                                           policy=policy, max_batch=8))
           for policy in ("token", "recycle")}
    assert out["recycle"].recycled_groups > 0
    assert out["recycle"].masked_tokens <= 1.05 * out["token"].masked_tokens
    assert max(out["recycle"].lags) <= max(out["token"].lags)


def test_without_a_tail_no_group_is_late_and_every_policy_runs_the_strict_schedule():
    times = {policy: model.step_times(schedule(4, policy=policy)) for policy in model.POLICIES}
    assert all(t == pytest.approx(times["strict"], rel=1e-9) for t in times.values())


def test_an_unknown_policy_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="policy 'soft': one of strict, admission, drop, token, recycle"):
        schedule(policy="soft")

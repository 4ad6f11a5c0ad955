from __future__ import annotations

import statistics

import pytest
import torch

from areal.kernels.advantage import batch_normalise, gae, group_normalise, leave_one_out, per_token


def random_groups(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards with arbitrary, shuffled, non-contiguous group ids of sizes 1..6."""
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 7, (12,), generator=gen)
    ids = torch.randint(-1000, 1000, (12,), generator=gen).unique()[: len(sizes)]
    group_id = torch.repeat_interleave(ids, sizes[: len(ids)])
    group_id = group_id[torch.randperm(len(group_id), generator=gen)]
    return torch.randn(len(group_id), generator=gen, dtype=torch.float64) * 3 + 10, group_id


def members(group_id: torch.Tensor, i: int) -> list[int]:
    return [j for j in range(len(group_id)) if group_id[j] == group_id[i]]


@pytest.mark.parametrize("seed", range(4))
def test_group_normalise_matches_loop_reference(seed):
    rewards, group_id = random_groups(seed)
    expected, centred = [], []
    for i in range(len(rewards)):
        vals = [rewards[j].item() for j in members(group_id, i)]
        mean = statistics.fmean(vals)
        std = statistics.stdev(vals) if len(vals) > 1 else 0.0
        expected.append((rewards[i].item() - mean) / (std + 1e-6))
        centred.append(rewards[i].item() - mean)
    torch.testing.assert_close(group_normalise(rewards, group_id), torch.tensor(expected, dtype=torch.float64))
    torch.testing.assert_close(
        group_normalise(rewards, group_id, use_std=False), torch.tensor(centred, dtype=torch.float64)
    )


@pytest.mark.parametrize("seed", range(4))
def test_leave_one_out_matches_loop_reference(seed):
    rewards, group_id = random_groups(seed)
    expected = []
    for i in range(len(rewards)):
        others = [rewards[j].item() for j in members(group_id, i) if j != i]
        expected.append(rewards[i].item() - statistics.fmean(others) if others else 0.0)
    torch.testing.assert_close(leave_one_out(rewards, group_id), torch.tensor(expected, dtype=torch.float64))


def test_group_normalise_of_integer_rewards_is_float_and_singletons_are_zero():
    out = group_normalise(torch.tensor([1, 0, 1, 7]), torch.tensor([3, 3, 3, 9]))
    # group 3: mean 2/3, deviations (1/3, −2/3, 1/3), unbiased var (1/9 + 4/9 + 1/9) / 2 = 1/3, std = 0.57735
    assert out.dtype == torch.float32 and out[3] == 0
    assert out[:3].tolist() == pytest.approx([0.57735, -1.15470, 0.57735], abs=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_batch_normalise_matches_reference_over_masked_entries(seed):
    gen = torch.Generator().manual_seed(seed)
    adv = torch.randn(50, generator=gen, dtype=torch.float64) * 2 + 1
    mask = torch.rand(50, generator=gen) > 0.3
    kept = adv[mask].tolist()
    mean, std = statistics.fmean(kept), statistics.stdev(kept)
    expected = torch.tensor(
        [(a - mean) / (std + 1e-6) if m else 0.0 for a, m in zip(adv.tolist(), mask.tolist(), strict=True)],
        dtype=torch.float64,
    )
    torch.testing.assert_close(batch_normalise(adv, mask), expected)
    unmasked = batch_normalise(adv)
    assert unmasked.mean().abs() < 1e-12 and unmasked.std().item() == pytest.approx(1.0, abs=1e-6)


def gae_reference(rewards, values, lengths, gamma, lam):
    adv, ret, start = [], [], 0
    for n in lengths:
        r, v = rewards[start : start + n].tolist(), values[start : start + n].tolist()
        a, running = [0.0] * n, 0.0
        for t in reversed(range(n)):
            next_v = v[t + 1] if t + 1 < n else 0.0
            running = r[t] + gamma * next_v - v[t] + gamma * lam * running
            a[t] = running
        adv += a
        ret += [x + y for x, y in zip(a, v, strict=True)]
        start += n
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


@pytest.mark.parametrize("lengths,gamma,lam", [([5], 1.0, 1.0), ([3, 0, 7, 1], 0.99, 0.95), ([2, 9, 4], 0.9, 0.5)])
def test_gae_matches_per_token_loop_reference(lengths, gamma, lam):
    gen = torch.Generator().manual_seed(len(lengths))
    n = sum(lengths)
    rewards = torch.randn(n, generator=gen, dtype=torch.float64)
    values = torch.randn(n, generator=gen, dtype=torch.float64)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
    adv, ret = gae(rewards, values, cu, gamma=gamma, lam=lam)
    ref_adv, ref_ret = gae_reference(rewards, values, lengths, gamma, lam)
    torch.testing.assert_close(adv, ref_adv)
    torch.testing.assert_close(ret, ref_ret)


def test_gae_with_gamma_lam_one_and_outcome_reward_is_reward_to_go_minus_value():
    rewards = torch.tensor([0.0, 0.0, 1.0, 0.0, 2.0])
    values = torch.tensor([0.5, 0.25, 0.0, 1.0, 0.0])
    adv, ret = gae(rewards, values, torch.tensor([0, 3, 5]))
    assert ret.tolist() == [1.0, 1.0, 1.0, 2.0, 2.0]
    assert adv.tolist() == [0.5, 0.75, 1.0, 1.0, 2.0]


def test_per_token_broadcasts_sample_values_to_packed_tokens():
    out = per_token(torch.tensor([1.5, -2.0, 3.0]), torch.tensor([2, 0, 3]))
    assert out.tolist() == [1.5, 1.5, 3.0, 3.0, 3.0]

"""The clipped value loss against a float64 per-token reference, gradients included."""

from __future__ import annotations

import pytest
import torch

from areal.kernels.value import clipped_value_loss


def reference(values: list[float], old: list[float], returns: list[float], eps: float | None) -> float:
    total = 0.0
    for v, o, r in zip(values, old, returns, strict=True):
        error = (v - r) ** 2
        if eps is not None:
            error = max(error, (o + min(max(v - o, -eps), eps) - r) ** 2)
        total += error
    return 0.5 * total / len(values)


@pytest.mark.parametrize("eps", [0.2, 0.05, None])
def test_the_loss_and_its_gradient_match_a_float64_reference(eps):
    g = torch.Generator().manual_seed(0)
    old = torch.randn(40, generator=g, dtype=torch.float64)
    values = (old + 0.3 * torch.randn(40, generator=g, dtype=torch.float64)).requires_grad_()
    returns = torch.randn(40, generator=g, dtype=torch.float64)
    loss, stats = clipped_value_loss(values, old, returns, clip_eps=eps)
    expected = reference(values.detach().tolist(), old.tolist(), returns.tolist(), eps)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-12)
    loss.backward()
    h = 1e-6  # central differences of the reference, one value at a time
    for i in range(0, 40, 7):
        up, down = values.detach().clone(), values.detach().clone()
        up[i] += h
        down[i] -= h
        numeric = (reference(up.tolist(), old.tolist(), returns.tolist(), eps)
                   - reference(down.tolist(), old.tolist(), returns.tolist(), eps)) / (2 * h)
        assert float(values.grad[i]) == pytest.approx(numeric, abs=1e-7)
    if eps == 0.05:
        assert 0.0 < stats.value_clip_fraction < 1.0  # some tokens moved further than ε, some did not
    if eps is None:
        assert stats.value_clip_fraction == 0.0


def test_a_value_moved_past_epsilon_gets_no_gradient_when_the_clipped_error_is_worse():
    values = torch.tensor([1.0], dtype=torch.float64, requires_grad=True)
    loss, stats = clipped_value_loss(values, torch.tensor([0.0]), torch.tensor([2.0]), clip_eps=0.2)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(0.5 * 1.8**2) and stats.value_clip_fraction == 1.0
    assert float(values.grad[0]) == 0.0  # the clipped branch is flat in V


def test_explained_variance_is_one_for_a_perfect_critic_and_zero_for_a_constant_one():
    returns = torch.tensor([0.0, 1.0, 2.0, 3.0])
    assert clipped_value_loss(returns.clone(), returns, returns)[1].explained_variance == pytest.approx(1.0)
    flat = torch.full((4,), returns.mean().item())
    assert clipped_value_loss(flat, flat, returns)[1].explained_variance == pytest.approx(0.0)


def test_shapes_must_agree():
    with pytest.raises(ValueError, match="must all be \\[N\\]"):
        clipped_value_loss(torch.zeros(3), torch.zeros(2), torch.zeros(3))

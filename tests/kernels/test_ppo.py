from __future__ import annotations

import itertools
import math

import pytest
import torch

from areal.kernels.ppo import PPOStats, approx_prox_logp, decoupled_ppo_loss, standard_ppo_loss


def reference(logp, prox, behav, adv, mask, *, eps, cap, dual_clip, ref_logp, kl_coef, eps_high=None, entropy=None,
              entropy_coef=0.0, lengths=None):
    """Token-by-token float64 loop: (loss, d loss / d logp, d loss / d entropy) from the formula, gradients by
    hand. With `lengths` (the samples' token counts) the ratio is GSPO's: a sample's geometric mean over its kept
    tokens, whose gradient at token t (GSPO-token) is the ratio times that of log π_θ(t) alone."""
    n_valid = max(sum(bool(m) for m in mask.tolist()), 1)
    loss, grad, capped = 0.0, [0.0] * len(logp), 0
    grad_entropy = [0.0] * len(logp)
    sample_ratio = {}
    if lengths is not None:
        starts = [sum(lengths[:j]) for j in range(len(lengths))]
        for start, n in zip(starts, lengths, strict=True):
            logs = [logp[t].item() - prox[t].item() for t in range(start, start + n)
                    if mask[t] and (cap is None or math.exp(prox[t].item() - behav[t].item()) <= cap)]
            for t in range(start, start + n):
                sample_ratio[t] = math.exp(sum(logs) / len(logs)) if logs else 1.0
    for t, (lp, px, bh, a, m) in enumerate(
        zip(logp.tolist(), prox.tolist(), behav.tolist(), adv.tolist(), mask.tolist(), strict=True)
    ):
        if not m:
            continue
        if ref_logp is not None:  # k3 = e^(ref − lp) − (ref − lp) − 1
            d = ref_logp[t].item() - lp
            loss += kl_coef * (math.exp(d) - d - 1) / n_valid
            grad[t] += kl_coef * (1 - math.exp(d)) / n_valid
        if entropy is not None:  # the bonus: −coef · H per valid token, capped or not
            loss -= entropy_coef * entropy[t].item() / n_valid
            grad_entropy[t] = -entropy_coef / n_valid
        w = math.exp(px - bh)
        if cap is not None and w > cap:
            capped += 1
            continue
        u = sample_ratio[t] if lengths is not None else math.exp(lp - px)
        clipped_u = min(max(u, 1 - eps), 1 + (eps if eps_high is None else eps_high))
        obj, d_obj = (u * a, u * a) if u * a <= clipped_u * a else (clipped_u * a, 0.0)
        if dual_clip is not None and a < 0 and obj < dual_clip * a:
            obj, d_obj = dual_clip * a, 0.0
        loss -= w * obj / n_valid
        grad[t] -= w * d_obj / n_valid
    return loss, torch.tensor(grad, dtype=torch.float64), capped, torch.tensor(grad_entropy, dtype=torch.float64)


def random_inputs(n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    behav = -torch.rand(n, generator=gen, dtype=torch.float64) * 4
    prox = behav + torch.randn(n, generator=gen, dtype=torch.float64) * 0.8  # some w > 5 at this spread
    logp = (prox + torch.randn(n, generator=gen, dtype=torch.float64) * 0.3).requires_grad_()
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    mask = torch.rand(n, generator=gen) > 0.25
    ref = behav + torch.randn(n, generator=gen, dtype=torch.float64) * 0.2
    return logp, prox, behav, adv, mask, ref


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"behav_weight_cap": None},
        {"clip_eps": 0.1, "dual_clip": 3.0},
        {"behav_weight_cap": 2.0, "kl_coef": 0.05, "use_ref": True},
        {"clip_eps_high": 0.28},  # DAPO's clip-higher
        {"clip_eps": 0.1, "clip_eps_high": 0.05, "dual_clip": 2.0},
        {"entropy_coef": 0.01, "use_entropy": True},
        {"behav_weight_cap": 2.0, "entropy_coef": 0.3, "use_entropy": True, "kl_coef": 0.05, "use_ref": True},
        {"use_entropy": True},  # reported, not in the loss
        {"lengths": [37, 1, 60, 2, 100]},  # GSPO's sequence ratio
        {"lengths": [50, 50, 100], "clip_eps": 0.05, "dual_clip": 3.0, "behav_weight_cap": 2.0},
        {"lengths": [200], "clip_eps": 3e-4, "clip_eps_high": 4e-4},  # GSPO's own range: most samples clipped
    ],
)
def test_loss_and_gradient_match_float64_loop_reference(seed, options):
    opts = dict(options)
    logp, prox, behav, adv, mask, ref_logp = random_inputs(200, seed)
    ref_logp = ref_logp if opts.pop("use_ref", False) else None
    entropy = (torch.rand(200, generator=torch.Generator().manual_seed(seed + 100), dtype=torch.float64) * 3
               ).requires_grad_() if opts.pop("use_entropy", False) else None
    lengths = opts.pop("lengths", None)
    kw = {"clip_eps": 0.2, "clip_eps_high": None, "behav_weight_cap": 5.0, "dual_clip": None, "kl_coef": 0.0,
          "entropy_coef": 0.0} | opts
    cu = None if lengths is None else torch.tensor([0, *itertools.accumulate(lengths)])

    loss, stats = decoupled_ppo_loss(logp, prox, behav, adv, mask, ref_logp=ref_logp, entropy=entropy,
                                     cu_seqlens=cu, **kw)
    grads = torch.autograd.grad(loss, [logp] if entropy is None else [logp, entropy], allow_unused=True)
    grad = grads[0]
    ref_loss, ref_grad, ref_capped, ref_grad_entropy = reference(
        logp.detach(),
        prox,
        behav,
        adv,
        mask,
        eps=kw["clip_eps"],
        eps_high=kw["clip_eps_high"],
        cap=kw["behav_weight_cap"],
        dual_clip=kw["dual_clip"],
        ref_logp=ref_logp,
        kl_coef=kw["kl_coef"],
        entropy=entropy,
        entropy_coef=kw["entropy_coef"],
        lengths=lengths,
    )
    assert loss.item() == pytest.approx(ref_loss, rel=1e-12, abs=1e-12)
    if entropy is not None:
        grad_entropy = torch.zeros_like(ref_grad_entropy) if grads[1] is None else grads[1]  # None: unused
        torch.testing.assert_close(grad_entropy, ref_grad_entropy, rtol=1e-10, atol=1e-12)
        assert stats.entropy == pytest.approx(float(entropy.detach()[mask].mean()), rel=1e-12)
    else:
        assert stats.entropy is None
    torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-12)
    assert stats.capped_tokens == ref_capped and stats.valid_tokens == int(mask.sum())
    assert (stats.dual_clip_fraction is None) == (kw["dual_clip"] is None)
    assert (stats.kl_to_ref is None) == (ref_logp is None)


def test_decoupled_equals_standard_ppo_when_prox_is_behav():
    logp, _, behav, adv, mask, _ = random_inputs(300, 11)
    decoupled, d_stats = decoupled_ppo_loss(logp, behav, behav, adv, mask)
    (d_grad,) = torch.autograd.grad(decoupled, logp)
    standard, s_stats = standard_ppo_loss(logp, behav, adv, mask)
    (s_grad,) = torch.autograd.grad(standard, logp)
    # textbook PPO written independently: −mean over valid tokens of min(r A, clip(r) A), r = π_θ / π_behav
    ratio = torch.exp(logp - behav)
    textbook = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)[mask].mean()
    (t_grad,) = torch.autograd.grad(textbook, logp)

    assert decoupled.item() == standard.item()
    assert torch.equal(d_grad, s_grad) and d_stats == s_stats
    torch.testing.assert_close(decoupled, textbook, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(d_grad, t_grad, rtol=1e-14, atol=1e-14)
    assert d_stats.capped_tokens == 0 and d_stats.importance_weight_max == 1.0


def test_hand_worked_clip_boundary():
    # ε = 0.2, π_prox = π_behav (w = 1), three valid tokens:
    #   t0: u = 1.21 (just past 1 + ε), A = +1: min(1.21·1, 1.2·1) = 1.2, clipped -> no gradient
    #   t1: u = 1.19 (just inside),      A = +1: min(1.19, 1.19) = 1.19, gradient −u·A/3 = −1.19/3
    #   t2: u = 0.79 (just past 1 − ε),  A = −1: min(−0.79, −0.80) = −0.80, clipped -> no gradient
    # loss = −(1.2 + 1.19 − 0.80) / 3 = −1.59 / 3 = −0.53; clip fraction 2/3
    prox = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    logp = (prox + torch.log(torch.tensor([1.21, 1.19, 0.79], dtype=torch.float64))).requires_grad_()
    adv = torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64)
    loss, stats = decoupled_ppo_loss(logp, prox, prox, adv, torch.ones(3, dtype=torch.bool), clip_eps=0.2)
    (grad,) = torch.autograd.grad(loss, logp)
    assert loss.item() == pytest.approx(-0.53, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([0.0, -1.19 / 3, 0.0], dtype=torch.float64))
    assert stats.clip_fraction == pytest.approx(2 / 3)


def test_cap_masks_token_out_of_loss_and_gradient_but_not_the_denominator():
    # token 1: w = π_prox/π_behav = 6 > cap 5 -> masked and counted; tokens 0, 2: w = 1, u = 1
    behav = torch.tensor([-1.0, -1.0 - math.log(6.0), -1.0], dtype=torch.float64)
    prox = torch.tensor([-1.0, -1.0, -1.0], dtype=torch.float64)
    logp = prox.clone().requires_grad_()
    adv = torch.tensor([1.0, 5.0, 2.0], dtype=torch.float64)
    loss, stats = decoupled_ppo_loss(logp, prox, behav, adv, torch.ones(3), behav_weight_cap=5.0)
    (grad,) = torch.autograd.grad(loss, logp)
    assert loss.item() == pytest.approx(-(1.0 + 2.0) / 3)  # divided by the 3 valid tokens, not the 2 kept
    assert grad[1] == 0 and grad[0] == pytest.approx(-1 / 3) and grad[2] == pytest.approx(-2 / 3)
    assert stats.capped_tokens == 1
    assert stats.importance_weight_max == pytest.approx(6.0)
    assert stats.importance_weight_mean == pytest.approx(8 / 3)


def test_masked_tokens_with_overflowing_ratios_give_finite_gradients():
    logp = torch.tensor([-1.0, 0.0, 500.0], dtype=torch.float32, requires_grad=True)  # e^500 overflows
    prox = torch.tensor([-1.0, -900.0, -1.0])  # token 1: w = e^900 = inf, capped
    behav = torch.tensor([-1.0, -1000.0, -1.0])
    loss, stats = decoupled_ppo_loss(logp, prox, behav, torch.ones(3), torch.tensor([1, 1, 0]))
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert grad.tolist() == [-0.5, 0.0, 0.0] and stats.capped_tokens == 1


def test_dual_clip_bounds_negative_advantage_term():
    # A = −1, u = 5: standard objective min(−5, −1.2) = −5 (loss +5, unbounded in u); dual clip 3 floors
    # it at 3·A = −3, so the loss term is +3 and carries no gradient
    logp = torch.tensor([math.log(5.0)], dtype=torch.float64, requires_grad=True)
    zero, adv = torch.zeros(1, dtype=torch.float64), -torch.ones(1, dtype=torch.float64)
    loss, stats = decoupled_ppo_loss(logp, zero, zero, adv, torch.ones(1), dual_clip=3.0)
    (grad,) = torch.autograd.grad(loss, logp)
    assert loss.item() == pytest.approx(3.0) and grad.item() == 0.0 and stats.dual_clip_fraction == 1.0


def test_stats_are_plain_detached_numbers():
    logp, prox, behav, adv, mask, _ = random_inputs(50, 3)
    _, stats = decoupled_ppo_loss(logp, prox, behav, adv, mask)
    assert isinstance(stats, PPOStats) and isinstance(stats.capped_tokens, int)
    for name in ("loss", "clip_fraction", "importance_weight_mean", "importance_weight_max", "approx_kl"):
        assert type(getattr(stats, name)) is float


def test_mismatched_shapes_name_the_argument():
    x = torch.zeros(4)
    with pytest.raises(ValueError, match=r"advantages has shape \(3,\), expected \[N\]=4"):
        decoupled_ppo_loss(x, x, x, torch.zeros(3), x)


def test_approx_prox_alpha_at_each_version_gap():
    # v_θ = 5 (this update publishes 5; π_prox is version 4)
    versions = torch.tensor([4, 3, 2, 5, 0])  # α = 0, 1/2, 2/3, 0 (on-policy for π_θ), 4/5
    behav = torch.zeros(5, dtype=torch.float64)
    logp = torch.ones(5, dtype=torch.float64, requires_grad=True)
    approx = approx_prox_logp(behav, logp, versions, current_version=5)
    torch.testing.assert_close(approx, torch.tensor([0, 1 / 2, 2 / 3, 0, 4 / 5], dtype=torch.float64))
    assert not approx.requires_grad


def test_approx_prox_is_exact_when_logprobs_move_linearly_with_version():
    gen = torch.Generator().manual_seed(0)
    slope = torch.randn(40, generator=gen, dtype=torch.float64) * 0.1
    base = -torch.rand(40, generator=gen, dtype=torch.float64) * 3
    versions = torch.randint(0, 7, (40,), generator=gen)  # v_θ = 7, π_prox = version 6
    exact_at = lambda v: base + slope * v  # noqa: E731
    approx = approx_prox_logp(exact_at(versions), exact_at(torch.tensor(7)), versions, current_version=7)
    torch.testing.assert_close(approx, exact_at(torch.tensor(6)).expand(40))


def test_approx_prox_rejects_tokens_newer_than_current_version():
    with pytest.raises(ValueError, match=r"1 token\(s\) carry version up to 6, newer than current_version=5"):
        approx_prox_logp(torch.zeros(2), torch.zeros(2), torch.tensor([5, 6]), current_version=5)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_sample_weights_turn_the_token_mean_into_each_aggregation(agg):
    from areal.kernels.ppo import sample_weights

    gen = torch.Generator().manual_seed(3)
    tokens = torch.tensor([3, 9, 0, 1, 6])  # a sample of no tokens counts nowhere
    terms = [torch.randn(int(n), generator=gen, dtype=torch.float64) for n in tokens]
    weights = sample_weights(tokens, agg, max_tokens=12)
    weighted = torch.cat([t * w for t, w in zip(terms, weights, strict=True)]).sum() / tokens.sum()
    with_tokens = [t for t in terms if len(t)]
    expected = {"token-mean": torch.cat(terms).mean(),
                "seq-mean-token-mean": sum(t.mean() for t in with_tokens) / len(with_tokens),
                "seq-mean-token-sum": sum(t.sum() / 12 for t in with_tokens) / len(with_tokens)}[agg]
    assert float(weighted) == pytest.approx(float(expected), rel=1e-12)
    with pytest.raises(ValueError, match="loss aggregation must be one of"):
        sample_weights(tokens, "seq-sum", 12)

from __future__ import annotations

import pytest
import torch

from areal.kernels.logprob import next_token_logprobs, token_logprobs


def reference(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain float64 log-softmax: logp [N] and entropy [N]."""
    log_p = torch.log_softmax(logits.double() / temperature, dim=-1)
    return log_p.gather(1, tokens[:, None]).squeeze(1), -(log_p.exp() * log_p).sum(-1)


CASES = [  # (N, V, chunk_size, temperature, seed): chunks smaller than, equal to, larger than N, ragged tail
    (1, 5, 1024, 1.0, 0),
    (7, 11, 3, 0.7, 1),
    (16, 50, 16, 1.0, 2),
    (33, 128, 8, 1.3, 3),
    (64, 1000, 1024, 0.5, 4),
]


@pytest.mark.parametrize("n,v,chunk,temperature,seed", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_values_and_gradients_match_float64_reference(n, v, chunk, temperature, seed, dtype):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, v, generator=gen, dtype=torch.float64) * 3).to(dtype).requires_grad_()
    tokens = torch.randint(0, v, (n,), generator=gen)
    w_logp, w_ent = torch.randn(n, generator=gen, dtype=torch.float64), torch.randn(n, generator=gen)

    logp, ent = token_logprobs(logits, tokens, temperature=temperature, chunk_size=chunk, with_entropy=True)
    ref_leaf = logits.detach().double().requires_grad_()
    ref_logp, ref_ent = reference(ref_leaf, tokens, temperature)

    out_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    assert logp.dtype == ent.dtype == out_dtype and logp.shape == ent.shape == (n,)
    tol = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 1e-5}[dtype]  # same rounded inputs
    torch.testing.assert_close(logp.double(), ref_logp, rtol=tol, atol=tol)
    torch.testing.assert_close(ent.double(), ref_ent, rtol=tol, atol=tol)

    (grad,) = torch.autograd.grad((logp.double() * w_logp).sum() + (ent.double() * w_ent).sum(), logits)
    (ref_grad,) = torch.autograd.grad((ref_logp * w_logp).sum() + (ref_ent * w_ent).sum(), ref_leaf)
    assert grad.dtype == dtype
    grad_tol = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]  # bf16: grad stored in bf16
    torch.testing.assert_close(grad.double(), ref_grad, rtol=grad_tol, atol=grad_tol)


def test_gradient_without_entropy_matches_reference():
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(20, 30, generator=gen, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, 30, (20,), generator=gen)
    (grad,) = torch.autograd.grad(token_logprobs(logits, tokens, chunk_size=6, temperature=0.9).sum(), logits)
    (ref,) = torch.autograd.grad(reference(logits, tokens, 0.9)[0].sum(), logits)
    torch.testing.assert_close(grad, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("with_entropy", [False, True])
def test_gradcheck_custom_function(with_entropy):
    gen = torch.Generator().manual_seed(6)
    logits = torch.randn(9, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, 6, (9,), generator=gen)
    assert torch.autograd.gradcheck(
        lambda x: token_logprobs(x, tokens, temperature=0.8, chunk_size=4, with_entropy=with_entropy),
        (logits,),
    )


def test_entropy_only_loss_backpropagates():
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(5, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, 8, (5,), generator=gen)
    _, ent = token_logprobs(logits, tokens, chunk_size=2, with_entropy=True)
    (grad,) = torch.autograd.grad(ent.sum(), logits)
    (ref,) = torch.autograd.grad(reference(logits, tokens, 1.0)[1].sum(), logits)
    torch.testing.assert_close(grad, ref)


def test_autograd_saves_no_full_size_float_tensor_besides_the_logits():
    logits = torch.randn(64, 200, requires_grad=True)
    tokens = torch.randint(0, 200, (64,))
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        logp = token_logprobs(logits, tokens, chunk_size=16, with_entropy=True)[0]
    big = [t for t in saved if t.numel() >= logits.numel() and t.data_ptr() != logits.data_ptr()]
    assert big == [] and logp.requires_grad


def test_minus_infinity_logits_give_finite_entropy_and_gradients():
    # a vocabulary masked with -inf: those entries have p = 0 and contribute 0, never nan
    logits = torch.randn(6, 10, dtype=torch.float64)
    logits[:, 7:] = float("-inf")
    logits.requires_grad_()
    tokens = torch.randint(0, 7, (6,))
    logp, ent = token_logprobs(logits, tokens, chunk_size=4, with_entropy=True)
    (grad,) = torch.autograd.grad(logp.sum() + ent.sum(), logits)
    finite = logits.detach()[:, :7].clone().requires_grad_()
    ref_logp, ref_ent = reference(finite, tokens, 1.0)
    (ref_grad,) = torch.autograd.grad(ref_logp.sum() + ref_ent.sum(), finite)
    torch.testing.assert_close(ent, ref_ent)
    torch.testing.assert_close(grad[:, :7], ref_grad)
    assert torch.all(grad[:, 7:] == 0)


def test_out_of_range_token_is_a_clear_error():
    with pytest.raises(ValueError, match=r"token ids span 0\.\.9 but the vocabulary has 5 entries"):
        token_logprobs(torch.zeros(2, 5), torch.tensor([0, 9]))


def packed_reference(logits: torch.Tensor, ids: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(len(ids), dtype=torch.float64) + 0 * logits.sum()  # stays in the graph if all zero
    for s in range(len(cu) - 1):
        a, b = int(cu[s]), int(cu[s + 1])
        if b - a > 1:
            out[a + 1 : b] = reference(logits[a : b - 1], ids[a + 1 : b], 1.0)[0]
    return out


@pytest.mark.parametrize("lengths", [[5], [3, 1, 4], [2, 0, 6, 1, 0], [1, 1, 1]])
def test_next_token_logprobs_match_per_sequence_reference(lengths):
    gen = torch.Generator().manual_seed(sum(lengths))
    n, v = sum(lengths), 13
    logits = torch.randn(n, v, generator=gen, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, v, (n,), generator=gen)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
    weights = torch.randn(n, generator=gen, dtype=torch.float64)

    out = next_token_logprobs(logits, ids, cu, chunk_size=4)
    ref = packed_reference(logits, ids, cu)
    torch.testing.assert_close(out, ref)
    (grad,) = torch.autograd.grad((out * weights).sum(), logits)
    (ref_grad,) = torch.autograd.grad((ref * weights).sum(), logits)
    torch.testing.assert_close(grad, ref_grad)


def test_next_token_logprobs_do_not_leak_across_sequences():
    logits = torch.randn(7, 9, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 9, (7,))
    cu = torch.tensor([0, 3, 7])
    out, ent = next_token_logprobs(logits, ids, cu, with_entropy=True)
    assert out[0] == 0 and out[3] == 0 and ent[0] == 0 and ent[3] == 0
    # the last row of sequence 0 (row 2) predicts nothing: no output depends on it
    (grad,) = torch.autograd.grad(out.sum() + ent.sum(), logits)
    assert torch.all(grad[2] == 0) and torch.all(grad[6] == 0)
    assert grad[:2].abs().sum() > 0 and grad[3:6].abs().sum() > 0


def test_next_token_logprobs_rejects_boundaries_that_do_not_cover_the_tokens():
    with pytest.raises(ValueError, match=r"end at N=4"):
        next_token_logprobs(torch.zeros(4, 3), torch.zeros(4, dtype=torch.int64), torch.tensor([0, 2, 3]))


@pytest.mark.gpu
def test_cuda_matches_cpu_values_and_gradients():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(300, 500, generator=gen).requires_grad_()
    ids = torch.randint(0, 500, (300,), generator=gen)
    cu = torch.tensor([0, 120, 121, 300])
    results = []
    for device in ("cpu", "cuda"):
        leaf = logits.detach().to(device).bfloat16().requires_grad_()
        logp, ent = next_token_logprobs(leaf, ids.to(device), cu.to(device), chunk_size=64, with_entropy=True)
        (grad,) = torch.autograd.grad(logp.sum() + ent.sum(), leaf)
        results.append((logp.cpu(), ent.cpu(), grad.float().cpu()))
    for cpu_t, cuda_t in zip(*results, strict=True):
        torch.testing.assert_close(cuda_t, cpu_t, rtol=2e-2, atol=2e-2)

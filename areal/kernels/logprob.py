"""Token log-probabilities from logits, chunked so the full log-softmax never exists.

A [T, V] float32 log-softmax at T=8192, V=32k is 1 GiB, and autograd keeps it (plus two more
of its size in backward). Here a custom autograd Function walks T in chunks: forward keeps only
the per-token log-sum-exp (and entropy), backward recomputes softmax one chunk at a time and
writes that chunk's gradient. Peak extra memory is then the logits' gradient plus one chunk.

This module does not fuse the LM head matmul (the logits are still materialised by the caller).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # float64 in, float64 out (references and gradcheck); every narrower float runs in float32
    return torch.float64 if dtype == torch.float64 else torch.float32


def _scaled_rows(logits: Tensor, start: int, end: int, temperature: float, scratch: Tensor | None) -> Tensor:
    """logits[start:end] / temperature in the compute dtype: a view when nothing changes, else in scratch."""
    rows = logits[start:end]
    if scratch is None:
        return rows
    out = scratch[: end - start].copy_(rows)
    return out.div_(temperature) if temperature != 1.0 else out


class _ChunkedTokenLogprob(torch.autograd.Function):
    """log p(token) = z[token] − logsumexp(z), z = logits / temperature, one chunk of rows at a time.

    Entropy H = −Σ p log p is differentiable: dH/dz_j = −p_j (log p_j + H). Each pass allocates
    its [chunk, V] scratch once and reuses it (fresh pages per chunk cost as much as the maths);
    when the logits are already in the compute dtype, backward works inside the gradient itself.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, logits: Tensor, tokens: Tensor, temperature: float, chunk_size: int, with_entropy: bool
    ) -> Tensor | tuple[Tensor, Tensor]:
        n, vocab = logits.shape
        dtype = _compute_dtype(logits.dtype)
        rows = min(chunk_size, n)
        needs_copy = logits.dtype != dtype or temperature != 1.0
        # one scratch: the scaled copy when one is needed (then exp'd in place), else exp(z − max) alone
        scratch = torch.empty(rows, vocab, dtype=dtype, device=logits.device)
        logp = torch.empty(n, dtype=dtype, device=logits.device)
        lse = torch.empty(n, dtype=dtype, device=logits.device)
        entropy = torch.empty(n, dtype=dtype, device=logits.device) if with_entropy else None
        for start in range(0, n, chunk_size):
            end = min(start + chunk_size, n)
            z = _scaled_rows(logits, start, end, temperature, scratch if needs_copy else None)
            z_token = z.gather(1, tokens[start:end, None]).squeeze(1)
            row_max = z.amax(dim=-1, keepdim=True)
            shifted_exp = torch.sub(z, row_max, out=scratch[: end - start]).exp_()
            sum_exp = shifted_exp.sum(dim=-1)
            chunk_lse = row_max.squeeze(1) + sum_exp.log()
            lse[start:end] = chunk_lse
            logp[start:end] = z_token - chunk_lse
            if entropy is not None:
                # H = log Σe − Σ e·log e / Σe, e = exp(z − max); xlogy keeps e = 0 (z = −inf) at 0, not nan
                entropy[start:end] = sum_exp.log() - shifted_exp.xlogy_(shifted_exp).sum(dim=-1) / sum_exp
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        ctx.with_entropy = with_entropy
        ctx.set_materialize_grads(False)
        if entropy is None:
            ctx.save_for_backward(logits, tokens, lse)
            return logp
        ctx.save_for_backward(logits, tokens, lse, entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, None, None, None, None]:
        logits, tokens, lse, *rest = ctx.saved_tensors
        entropy = rest[0] if rest else None
        grad_logp = grads[0]
        grad_entropy = grads[1] if ctx.with_entropy else None
        if grad_logp is None and grad_entropy is None:
            return None, None, None, None, None
        (n, vocab), temperature = logits.shape, ctx.temperature
        dtype = _compute_dtype(logits.dtype)
        rows = min(ctx.chunk_size, n)
        grad_logp = torch.zeros(n, dtype=dtype, device=logits.device) if grad_logp is None else grad_logp
        grad_logits = torch.empty_like(logits)
        in_place = logits.dtype == dtype  # else work in float32 and round once into the narrower gradient

        def scratch() -> Tensor:
            return torch.empty(rows, vocab, dtype=dtype, device=logits.device)

        work = None if in_place else scratch()
        probs = scratch() if grad_entropy is not None else None
        for start in range(0, n, ctx.chunk_size):
            end = min(start + ctx.chunk_size, n)
            g = grad_logits[start:end] if work is None else work[: end - start]
            if temperature == 1.0 and in_place:
                torch.sub(logits[start:end], lse[start:end, None], out=g)
            else:
                g.copy_(logits[start:end]).div_(temperature).sub_(lse[start:end, None])
            g_lp = grad_logp[start:end, None].to(dtype)
            if probs is None:
                # d logp / dz = onehot − p; the one-hot part is the scatter below
                g.exp_().mul_(-g_lp / temperature)
            else:
                assert grad_entropy is not None and entropy is not None  # probs exists only for an entropy grad
                # −(g_H · p log p + p · (g_logp + g_H · H)), then the one-hot part below
                p = torch.exp(g, out=probs[: end - start])
                g_h = grad_entropy[start:end, None].to(dtype)
                torch.xlogy(p, p, out=g).mul_(g_h)
                g.add_(p.mul_(g_lp + g_h * entropy[start:end, None])).mul_(-1.0 / temperature)
            g.scatter_add_(1, tokens[start:end, None], g_lp / temperature)
            if work is not None:
                grad_logits[start:end] = g
        return grad_logits, None, None, None, None


def token_logprobs(
    logits: Tensor,
    tokens: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """log π(tokens[i] | logits[i] / temperature), and the entropy of that distribution if asked.

    logits: [N, V] any float dtype; tokens: [N] int64. Returns [N] float32 (float64 when the logits
    are float64). Both outputs are differentiable with respect to the logits; the full [N, V]
    log-softmax is never held, in forward or in backward (only `chunk_size` rows at a time).
    """
    if logits.dim() != 2:
        raise ValueError(f"token_logprobs: logits must be [N, V], got shape {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"token_logprobs: logits must be a float tensor, got {logits.dtype}")
    if tokens.shape != logits.shape[:1]:
        raise ValueError(
            f"token_logprobs: tokens must be [N]={logits.shape[0]} to match logits, got {tuple(tokens.shape)}"
        )
    if temperature <= 0:
        raise ValueError(f"token_logprobs: temperature must be > 0, got {temperature}")
    if chunk_size <= 0:
        raise ValueError(f"token_logprobs: chunk_size must be > 0, got {chunk_size}")
    tokens = tokens.long()
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= logits.shape[1]):
        raise ValueError(
            f"token_logprobs: token ids span {int(tokens.min())}..{int(tokens.max())} "
            f"but the vocabulary has {logits.shape[1]} entries"
        )
    return _ChunkedTokenLogprob.apply(logits, tokens, float(temperature), int(chunk_size), with_entropy)


def next_token_logprobs(
    logits: Tensor, input_ids: Tensor, cu_seqlens: Tensor, **kw: Any
) -> Tensor | tuple[Tensor, Tensor]:
    """Per-token log π(input_ids[t] | earlier tokens of t's sequence), on packed sequences.

    logits: [N, V] for N packed tokens; input_ids: [N]; cu_seqlens: [S+1] int64 boundaries.
    out[t] comes from logits[t-1]; the first token of every sequence has no prediction and gets 0
    (entropy too), and receives no gradient, so nothing leaks across sequences. `kw` goes to
    `token_logprobs` (temperature, chunk_size, with_entropy).
    """
    n = logits.shape[0]
    if input_ids.shape != (n,):
        raise ValueError(f"next_token_logprobs: input_ids must be [N]={n}, got {tuple(input_ids.shape)}")
    if cu_seqlens.dim() != 1 or len(cu_seqlens) == 0 or int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != n:
        raise ValueError(
            f"next_token_logprobs: cu_seqlens must be 1-D, start at 0 and end at N={n}, got {cu_seqlens.tolist()}"
        )
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    if bool((lengths < 0).any()):
        raise ValueError(f"next_token_logprobs: cu_seqlens must be non-decreasing, got {cu_seqlens.tolist()}")
    with_entropy = kw.get("with_entropy", False)
    if n == 0:
        empty = logits.new_zeros(0, dtype=_compute_dtype(logits.dtype))
        return (empty, empty.clone()) if with_entropy else empty
    is_first = torch.zeros(n, dtype=torch.bool, device=logits.device)
    is_first[cu_seqlens[:-1][lengths > 0].to(logits.device)] = True
    shifted = token_logprobs(logits[:-1], input_ids[1:], **kw)
    outputs = shifted if isinstance(shifted, tuple) else (shifted,)
    # row t-1 predicts token t; a sequence's first token would read the previous sequence's last row
    aligned = [
        torch.where(is_first, torch.zeros((), dtype=o.dtype, device=o.device), torch.cat([o.new_zeros(1), o]))
        for o in outputs
    ]
    return (aligned[0], aligned[1]) if with_entropy else aligned[0]

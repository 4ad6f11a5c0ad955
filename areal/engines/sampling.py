"""Token sampling that depends on the request, not on the batch it happens to share.

Each request owns a stream of uniforms drawn from a generator seeded from (engine seed,
request_id); its t-th token is the inverse CDF of its t-th uniform. So the same request gives
the same tokens whether it ran alone, in a full batch, or was re-prefilled after a weight update
(up to float rounding of the logits). The logprob returned is that of the temperature-scaled
distribution, not of the top-p-renormalised one: it is what a trainer's forward pass computes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch
from torch import Tensor

from areal.engines.lists import list_tensor

_MASK64 = 0xFFFFFFFFFFFFFFFF


def request_seed(seed: int, request_id: int) -> int:
    """Mix (seed, request_id) into one 63-bit seed (splitmix64 finaliser), so nearby ids decorrelate."""
    z = (seed * 0x9E3779B97F4A7C15 + request_id + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def request_uniforms(seed: int, request_id: int, n: int) -> list[float]:
    """The n uniforms in [0, 1) that decide request_id's tokens 0..n-1."""
    return uniform_stream(seed, request_id, n).tolist()


def uniform_stream(seed: int, request_id: int, n: int) -> Tensor:
    """`request_uniforms` as the float32 tensor [n] they are drawn as (the slot engine keeps them so: a refill's
    conversion of Python floats cost more than the draw)."""
    generator = torch.Generator().manual_seed(request_seed(seed, request_id))
    return torch.rand(n, generator=generator)


def sample_tokens(logits: Tensor, u: Tensor, *, temperature: float, top_p: float) -> tuple[Tensor, Tensor]:
    """One token per row by inverse CDF of softmax(logits / T), nucleus-truncated when top_p < 1.

    logits: [B, V]; u: [B] float64 in [0, 1). Returns tokens [B] int64 and their logprobs [B]
    float32 under softmax(logits / T). The CDF is float64 and the target u·total with u < 1 is
    below the total, so the draw always lands on a token of positive probability. T = 0 is greedy
    decoding (for evaluation; `u` is unused and the logprob is under softmax(logits)).
    """
    if temperature == 0:  # greedy: the argmax, with its logprob under softmax(logits)
        tokens = logits.argmax(dim=-1)
        return tokens, torch.log_softmax(logits.float(), dim=-1).gather(1, tokens[:, None]).squeeze(1)
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    probs, order = logp_all.exp(), None
    if top_p < 1.0:
        probs, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the token that crosses it included)
        probs = probs.masked_fill((probs.cumsum(-1) - probs) >= top_p, 0.0)
    cdf = probs.double().cumsum(-1)
    index = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp(max=cdf.shape[1] - 1)
    tokens = (index if order is None else order.gather(1, index)).squeeze(1)
    return tokens, logp_all.gather(1, tokens[:, None]).squeeze(1)


def check_sampling(engine: str, temperature: float, top_p: float, stop_strings: object, decode: object) -> None:
    """The argument checks every generation engine shares, with messages that name the engine."""
    if temperature < 0:
        raise ValueError(f"{engine}: temperature must be > 0, or 0 for greedy decoding, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"{engine}: top_p must be in (0, 1], got {top_p}")
    if stop_strings and decode is None:
        raise ValueError(
            f"{engine}: stop_strings need a decode function (token ids -> text); "
            "pass decode=tokenizer.decode, or give stop_sequences as token ids instead"
        )


def request_stops(request: Any, default: list[str], decode: object) -> list[str]:
    """The stop strings of one request: its own when it names some (None: the engine's), checked."""
    stops = getattr(request, "stop", None)
    if stops is None:
        return default
    stops = [str(s) for s in stops if s]
    if stops and decode is None:
        raise ValueError(f"request {request.request_id}: stop strings need the engine's decode function "
                         "(token ids -> text); give the engine decode=tokenizer.decode")
    return stops


def finish_reason(
    out: list[int], limit: int, eos_token_id: int, stop_sequences: list[list[int]],
    stop_strings: list[str], decode: Callable[[list[int]], str] | None, stop_window: int,
) -> Literal["eos", "stop", "length"] | None:
    """Why a sequence whose tokens so far are `out` ends now, or None while it goes on.

    Stop strings are looked for in the decoded last `stop_window` tokens (a token is at least
    one character, so a stop string lies within its length in tokens).
    """
    if out[-1] == eos_token_id:
        return "eos"
    if any(len(s) <= len(out) and out[-len(s) :] == s for s in stop_sequences):
        return "stop"
    if stop_strings and decode is not None and any(s in decode(out[-stop_window:]) for s in stop_strings):
        return "stop"
    if len(out) >= limit:
        return "length"
    return None


def run_to_completion(engine: Any, requests: Iterable[Any]) -> list[Any]:
    """Submit `requests` to a stepped engine and step it until all finish; results in request order."""
    requests = list(requests)
    engine.submit(requests)
    done: dict[Any, Any] = {}
    while engine.pending():
        for result in engine.step():
            done[result.request_id] = result
    return [done[r.request_id] for r in requests]


def checked_request(request: Any, in_flight: set[int], max_new_tokens: int) -> tuple[Tensor, int]:
    """A request's prompt (1-D int64 on the CPU) and its token limit; ValueError naming the request when its
    prompt is empty, its id is in flight, or its limit is below 1. Every engine checks a batch with this before
    queueing any of it."""
    ids = request.prompt_ids
    prompt = (ids.to(torch.int64) if isinstance(ids, Tensor) else list_tensor(ids, torch.int64)).flatten().cpu()
    if prompt.numel() == 0:
        raise ValueError(f"request {request.request_id}: empty prompt; a prompt needs at least one token")
    if request.request_id in in_flight:
        raise ValueError(f"request {request.request_id}: this request_id is already in flight; ids must be unique")
    limit = max_new_tokens if request.max_new_tokens is None else request.max_new_tokens
    if limit < 1:
        raise ValueError(f"request {request.request_id}: max_new_tokens must be >= 1, got {limit}")
    return prompt, limit

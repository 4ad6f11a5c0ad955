"""Sequence packing: which sequences share a micro-batch, and which rank gets which sequences.

Packed micro-batches hold whole sequences end to end (`cu_seqlens` boundaries, no padding) under
a token budget. Fewer micro-batches means fewer forward/backward calls, so first-fit decreasing
picks the count; then the sequences are redealt over that many bins to even out their token
loads. Across data-parallel ranks there is no budget, only balance: Karmarkar–Karp's largest
differencing method. Only lengths are read here; building the packed tensors is the caller's job.

An engine that runs a micro-batch as right-padded rows pays for rows x longest positions, not for
its real tokens: `padded_microbatches` groups sequences of similar length to pay for few pads.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from areal.errors import ConfigError


class PackingError(ConfigError, ValueError):
    """A sequence cannot fit in any micro-batch: it alone is over the token budget (a setting to change, so a user
    error: its message names trainer.microbatch_tokens)."""

    def __init__(self, index: int, length: int, max_tokens: int) -> None:
        self.index, self.length, self.max_tokens = index, length, max_tokens
        super().__init__(
            f"sequence {index} has {length} tokens, over the micro-batch budget of {max_tokens} tokens; "
            f"raise the budget (trainer.microbatch_tokens) to at least {length} or cap the generation length"
        )


def _check_lengths(lengths: Sequence[int]) -> list[int]:
    out = [int(n) for n in lengths]
    for i, n in enumerate(out):
        if n < 0:
            raise ValueError(f"sequence {i} has a negative length ({n})")
    return out


def _first_fit_decreasing(lengths: list[int], order: list[int], max_tokens: int) -> list[list[int]]:
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        for b, load in enumerate(loads):
            if load + lengths[i] <= max_tokens:
                bins[b].append(i)
                loads[b] += lengths[i]
                break
        else:
            bins.append([i])
            loads.append(lengths[i])
    return bins


def _least_loaded_fit(lengths: list[int], order: list[int], n_bins: int, max_tokens: int) -> list[list[int]] | None:
    """Each sequence, longest first, into the least-loaded bin that still fits; None if one fits nowhere."""
    bins: list[list[int]] = [[] for _ in range(n_bins)]
    loads = [0] * n_bins
    for i in order:
        fitting = [b for b in range(n_bins) if loads[b] + lengths[i] <= max_tokens]
        if not fitting:
            return None
        b = min(fitting, key=lambda k: loads[k])
        bins[b].append(i)
        loads[b] += lengths[i]
    return bins


def pack_microbatches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices of the sequences in each micro-batch, each micro-batch at most max_tokens tokens.

    The number of micro-batches is first-fit decreasing's; the loads are then evened out by
    dealing the sequences, longest first, to the least-loaded bin that fits (kept only when every
    sequence fits). Every index appears exactly once; micro-batches are ordered by load, heaviest
    first, and list their indices in ascending order. Raises PackingError for a sequence over budget.
    """
    if max_tokens <= 0:
        raise ValueError(f"pack_microbatches: max_tokens must be > 0, got {max_tokens}")
    sizes = _check_lengths(lengths)
    for i, n in enumerate(sizes):
        if n > max_tokens:
            raise PackingError(i, n, max_tokens)
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    bins = _first_fit_decreasing(sizes, order, max_tokens)
    bins = _least_loaded_fit(sizes, order, len(bins), max_tokens) or bins
    bins = [sorted(b) for b in bins if b]
    return sorted(bins, key=lambda b: (-sum(sizes[i] for i in b), b[0]))


def padded_microbatches(lengths: Sequence[int], max_tokens: int, call_cost: int) -> list[list[int]]:
    """Indices of the sequences in each micro-batch of right-padded rows, each at most max_tokens positions.

    Minimises what the passes cost: every micro-batch's rows x longest positions, plus `call_cost`
    positions for each forward/backward call (its fixed overhead, in the time of one padded token).
    The optimum groups contiguous runs of the sequences sorted by length, so it is found exactly by
    dynamic programming over that order. Every index appears exactly once; micro-batches are ordered
    longest first and list their indices in ascending order. Raises PackingError for a sequence over budget.
    """
    if max_tokens <= 0:
        raise ValueError(f"padded_microbatches: max_tokens must be > 0, got {max_tokens}")
    if call_cost < 0:
        raise ValueError(f"padded_microbatches: call_cost must be >= 0, got {call_cost}")
    sizes = _check_lengths(lengths)
    for i, n in enumerate(sizes):
        if n > max_tokens:
            raise PackingError(i, n, max_tokens)
    order = sorted(range(len(sizes)), key=lambda i: (sizes[i], i))
    n = len(order)
    best = [0] * (n + 1)  # best[j]: the cheapest plan for the j shortest sequences
    cut = [0] * (n + 1)  # its last micro-batch starts at order[cut[j]]
    for j in range(1, n + 1):
        width = max(sizes[order[j - 1]], 1)  # the longest of order[i:j], whatever i
        start = min(range(max(0, j - max_tokens // width), j), key=lambda i: best[i] - i * width)
        best[j], cut[j] = best[start] + (j - start) * width + call_cost, start
    bins = []
    j = n
    while j > 0:
        bins.append(sorted(order[cut[j] : j]))
        j = cut[j]
    return bins


def balance_across_ranks(lengths: Sequence[int], n_ranks: int) -> list[list[int]]:
    """Split sequence indices into n_ranks lists of near-equal token totals (Karmarkar–Karp).

    Largest differencing: start from one partial partition per sequence, repeatedly merge the two
    partitions with the largest spread, pairing the heavier sides of one with the lighter sides of
    the other. Every index appears exactly once. With fewer sequences than ranks some lists are
    empty; the caller decides what an idle rank does.
    """
    if n_ranks <= 0:
        raise ValueError(f"balance_across_ranks: n_ranks must be > 0, got {n_ranks}")
    sizes = _check_lengths(lengths)
    # heap entry: (-spread, tiebreak, parts) with parts sorted by load, heaviest first
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = []
    for i, n in enumerate(sizes):
        parts = [(n, [i])] + [(0, []) for _ in range(n_ranks - 1)]
        heap.append((-n, i, parts))
    heapq.heapify(heap)
    tiebreak = len(sizes)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = [(la + lb, ia + ib) for (la, ia), (lb, ib) in zip(a, reversed(b), strict=True)]
        merged.sort(key=lambda p: -p[0])
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), tiebreak, merged))
        tiebreak += 1
    if not heap:
        return [[] for _ in range(n_ranks)]
    return [sorted(idx) for _, idx in heap[0][2]]


def padding_waste(lengths: Sequence[int], microbatches: Sequence[Sequence[int]]) -> float:
    """Fraction of tokens that are padding if each micro-batch is padded to its longest sequence."""
    sizes = _check_lengths(lengths)
    padded = sum(len(mb) * max((sizes[i] for i in mb), default=0) for mb in microbatches)
    real = sum(sizes[i] for mb in microbatches for i in mb)
    return (padded - real) / padded if padded else 0.0

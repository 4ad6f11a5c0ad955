"""One decode step over slots 0..n-1: the lean forward, the draw and the behaviour log-prob, in one call.

Eager, the step reads each slot's first `width` columns (the longest filled slot's). With CUDA graphs it is
captured once per size of a ladder (1, 2, 4, 8, 12, 16, 24, 32, 48, ... up to max_batch) over the whole cache width,
and a step of n rows replays the smallest captured size >= n: the rows past n are free slots, decoded and
ignored. What a graph captures is only the forward and the draw, which write the step's outputs and the K/V of
the tokens fed (the same values again if a warm-up fed them already); the slot state advances outside it, so
capturing, which runs the step once to warm up, changes nothing. Prefill stays eager.

A graph is captured the first time its size is needed (its warm-up run is that step's result), and all are
dropped when the cache is reallocated (`SlotKV.generation`). New weights land in the same storage (see lean.py),
so nothing captured goes stale on a weight update.

On a CPU with the C kernels running the layer loop (and the draw at top_p = 1), the eager step is one C call
(`LeanForward.decode_step`): the forward, the draw and the state's advance, with the same bits as the three calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor

from areal.engines.decode.slots import SlotKV
from areal.engines.sampling import sample_tokens


class Forward(Protocol):
    """What the step and the engine need of a forward (lean.LeanForward, or a stub in a benchmark)."""

    heads: int
    kv_heads: int
    head_dim: int
    num_layers: int
    dtype: torch.dtype
    device: torch.device

    def reserve(self, columns: int) -> None: ...
    def refresh(self) -> None: ...
    def decode(self, kv: Tensor, tokens: Tensor, positions: Tensor, width: int, shared: Any = None,
               slots: Tensor | None = None) -> Tensor: ...
    def extend(self, kv: Tensor, slots: Tensor, ids: Tensor, starts: Tensor, lengths: Tensor) -> Tensor: ...


def ladder(max_batch: int) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, 8, then steps of half a power of two (12, 16, 24, 32, 48, 64, 96, ...), and
    max_batch itself; a step pads to the next, so at most a third of a replay is padding past 8 rows."""
    sizes, size = [1, 2, 4, 8], 8
    while size < max_batch:
        sizes += [size + size // 2, 2 * size]
        size *= 2
    return sorted({s for s in sizes if s < max_batch} | {max_batch})


def cuda_capture(run: Callable[[], Any], pool: Any) -> Callable[[], None]:
    """Capture `run` into a CUDA graph (after one warm-up run on a side stream); the graph's replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        run()
    return graph.replay


class DecodeStep:
    """The decode step of a slot cache; `graphs` captures it per ladder size (`capture` is injectable for tests)."""

    def __init__(self, forward: Forward, cache: SlotKV, *, temperature: float, top_p: float, graphs: bool = False,
                 capture: Callable[[Callable[[], Any], Any], Callable[[], None]] | None = None) -> None:
        self.forward, self.cache = forward, cache
        self.temperature, self.top_p = temperature, top_p
        # the CPU kernels draw a step's tokens in one call where they can (sample_tokens' own ops cost more), and
        # where the layer loop is in C too, run the whole eager step in one call (its dozen torch ops cost more)
        kernels = getattr(forward, "kernels", None)
        self._drawer = kernels if temperature > 0 and top_p == 1.0 else None
        self.in_c = self._drawer is not None and not graphs and getattr(forward, "steps_in_c", False)
        self.graphs = graphs
        self.sizes = ladder(cache.slots)
        self._capture = capture or cuda_capture
        self._pool: Any = None
        self._replays: dict[int, Callable[[], None]] = {}
        self._generation = -1
        self._rows = torch.arange(cache.slots, device=cache.device)
        self._tokens = torch.zeros(cache.slots, dtype=torch.int64, device=cache.device)  # a replay's outputs
        self._logp = torch.zeros(cache.slots, dtype=torch.float32, device=cache.device)
        self.captured = 0  # graphs captured so far (a test reads it)

    def __call__(self, n: int, width: int, shared: Any = None, slots: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Decode slots 0..n-1 (each filled below `width` columns; `shared`: which hold the same prompt, for the CPU
        kernels): the tokens drawn and their log π_behav, [n] each, on the device; the slot state has advanced (free
        slots' draws mean nothing). Eager only, `slots` (int64, all below n) decodes those slots alone, the running
        ones when free slots sit among them: the tokens and log-probs are then theirs, in that order."""
        c = self.cache
        if self.in_c:  # the forward, the draw and the state's advance in one call
            rows = n if slots is None else slots.shape[0]
            return self.forward.decode_step(c.kv, c, rows, width, self.temperature, shared, slots)  # type: ignore[attr-defined]
        if self.graphs:
            if slots is not None:
                raise ValueError("DecodeStep: a replayed step decodes every slot below n; it takes no `slots`")
            tokens, logp = self._replayed(n)
        else:
            tokens, logp = self._sample(n, width, shared, slots)
        if slots is None:
            c.pending[:n] = tokens
            c.positions[:n] += c.live[:n]
            c.produced[:n] += c.live[:n]
        else:
            c.pending[slots] = tokens
            c.positions[slots] += 1
            c.produced[slots] += 1
        return tokens, logp

    def _sample(self, n: int, width: int, shared: Any = None, slots: Tensor | None = None) -> tuple[Tensor, Tensor]:
        c = self.cache
        rows, index = (slice(0, n), self._rows[:n]) if slots is None else (slots, slots)  # views where they can be
        logits = self.forward.decode(c.kv, c.pending[rows], c.positions[rows], width, shared, slots)
        u = c.uniforms[index, c.produced[rows]]
        if self._drawer is not None:
            return self._drawer.sample_rows(logits, u, self.temperature)
        return sample_tokens(logits, u, temperature=self.temperature, top_p=self.top_p)

    def _into_buffers(self, size: int) -> None:
        tokens, logp = self._sample(size, self.cache.columns)
        self._tokens[:size] = tokens
        self._logp[:size] = logp

    def _replayed(self, n: int) -> tuple[Tensor, Tensor]:
        if self._generation != self.cache.generation:  # tensors reallocated: what was captured reads old ones
            self._replays, self._generation = {}, self.cache.generation
        size = next(s for s in self.sizes if s >= n)
        replay = self._replays.get(size)
        if replay is None:
            self._replays[size] = self._capture(lambda: self._into_buffers(size), self._pool_handle())
            self.captured += 1
        else:
            replay()
        return self._tokens[:n], self._logp[:n]

    def _pool_handle(self) -> Any:
        if self._pool is None and self.cache.device.type == "cuda":
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

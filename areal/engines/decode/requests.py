"""What the slot engine keeps about its requests: each one in flight (its uniforms, its stop strings as one
pattern), and the prompts read under the current weights, whose K/V a newcomer of the same prompt copies."""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, cached_property

import torch
from torch import Tensor

from areal.engines.generation import InFlight
from areal.engines.lists import list_tensor


@dataclass(kw_only=True)
class Request(InFlight):
    """A request in flight, with its own stream of uniforms and its stop strings as one pattern."""

    uniforms: Tensor  # [limit] float32: token t is drawn at uniforms[t] (sampling.uniform_stream)
    stop_pattern: re.Pattern[str] | None = None
    stop_window: int = 0  # tokens decoded to look for a stop string: the longest's length (a token is >= 1 char)
    window: int = -1  # StopWindows' id of its last tokens (-1: none yet)

    def tokens(self) -> list[int]:
        return self.prompt.tolist() + self.output

    @cached_property
    def prompt_key(self) -> tuple[int, ...]:
        return tuple(self.prompt.tolist())

    @cached_property
    def prompt_len(self) -> int:
        return len(self.prompt)


@cache
def stop_pattern(stops: tuple[str, ...]) -> re.Pattern[str] | None:
    """One pattern that finds any of the stop strings (None for none): a row's check is one search, not one `in`
    per string."""
    return re.compile("|".join(map(re.escape, stops))) if stops else None


class StopWindows:
    """Whether a row's decoded last tokens hold one of its stop strings, in one lookup a row and step.

    Each window of last tokens (under its request's stop pattern) gets an id, and is decoded and searched once; a
    row keeps its window's id, and (id, next token) -> the next window's id is remembered: the window after a token
    depends only on the window before it and that token. Searching every row's decoded window each step was 8 % of
    a 128-row generate with the code recipe's stop strings. At most `capacity` windows and steps are remembered,
    then all are forgotten at once; ids are never reused, so a row holding a forgotten id looks its window up again.
    """

    def __init__(self, decode: Callable[[list[int]], str], capacity: int = 1 << 16) -> None:
        self._decode, self._capacity = decode, capacity
        self._ids: dict[tuple[re.Pattern[str], tuple[int, ...]], int] = {}
        self._holds: dict[int, bool] = {}
        self._after: dict[tuple[int, int], int] = {}
        self._next_id = 0

    def holds_stop(self, r: Request) -> bool:
        """With r's newest token appended: whether decode(its last stop_window tokens) holds a stop string."""
        step = (r.window, r.output[-1])
        window = self._after.get(step)
        if window is None:
            window = self._window(r)
            if r.window >= 0:  # a new row, or one re-queued with output, has no window to step from
                self._after[step] = window
        r.window = window
        return self._holds[window]

    def _window(self, r: Request) -> int:
        assert r.stop_pattern is not None
        if len(self._ids) >= self._capacity or len(self._after) >= self._capacity:
            self._ids.clear()
            self._holds.clear()
            self._after.clear()
        key = (r.stop_pattern, tuple(r.output[-r.stop_window :]))
        window = self._ids.get(key)
        if window is None:
            window = self._ids[key] = self._next_id
            self._next_id += 1
            self._holds[window] = r.stop_pattern.search(self._decode(list(key[1]))) is not None
        return window


class KeptPrompts:
    """Prompts read under the current weights: their K/V ([layers, 2, kv heads, length, head dim]), last logits
    and source (the read that wrote them), at most `capacity`, least recently used dropped first; `hits` counts
    newcomers served from here."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.hits = capacity, 0
        self._kept: OrderedDict[tuple[int, ...], tuple[Tensor, Tensor, int]] = OrderedDict()

    def __contains__(self, key: tuple[int, ...]) -> bool:
        return key in self._kept

    def keys(self) -> set[tuple[int, ...]]:
        return set(self._kept)

    def clear(self) -> None:
        self._kept.clear()

    def remember(self, key: tuple[int, ...], rows: Tensor, logits: Tensor, source: int) -> None:
        self._kept[key] = (rows, logits, source)
        self._kept.move_to_end(key)
        while len(self._kept) > self.capacity:
            self._kept.popitem(last=False)

    def get(self, key: tuple[int, ...]) -> tuple[Tensor, Tensor, int]:
        """A kept prompt, now the most recently used; counted as one newcomer served."""
        self._kept.move_to_end(key)
        self.hits += 1
        return self._kept[key]


def right_padded(rows: Sequence[list[int]], pad: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Token rows right-padded to the longest: ids [rows, width] and lengths [rows], on `device`."""
    width = max(map(len, rows))
    ids = list_tensor([r + [pad] * (width - len(r)) for r in rows], torch.int64, device)
    return ids, list_tensor([len(r) for r in rows], torch.int64, device)

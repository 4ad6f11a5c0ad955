"""What the slot engine keeps about its requests: each one in flight (its uniforms, its stop strings as one
pattern), and the prompts read under the current weights, whose K/V a newcomer of the same prompt copies."""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, cached_property

import torch
from torch import Tensor

from areal.engines.generation import InFlight
from areal.engines.lists import list_tensor


@dataclass(kw_only=True)
class Request(InFlight):
    """A request in flight, with its own stream of uniforms and its stop strings as one pattern."""

    uniforms: list[float]
    stop_pattern: re.Pattern[str] | None = None
    stop_window: int = 0  # tokens decoded to look for a stop string: the longest's length (a token is >= 1 char)

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

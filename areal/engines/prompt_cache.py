"""The torch engine's prompt cache: the KV rows and last logits of prompts read under the current weights.

A GRPO group's samples and a held-out task's samples share a prompt; a newcomer whose prompt is kept copies
its rows instead of reading it in a forward (on a small model a refill's forward is mostly per-call cost).
At most `capacity` prompts are kept, least recently used dropped first; the engine empties the cache when its
weights change.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from areal.engines.kv_rows import left_pad

PromptKey = tuple[int, ...]


@dataclass
class _CachedPrompt:
    """A prompt's KV rows (per layer, [1, heads, prompt length, head dim]) and the logits after its last token."""

    keys: list[Tensor]
    values: list[Tensor]
    logits: Tensor  # [V]


class PromptCache:
    """Prompts by their token ids; `hits` counts the newcomers served from it."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._prompts: OrderedDict[PromptKey, _CachedPrompt] = OrderedDict()
        self.hits = 0

    def __contains__(self, key: PromptKey) -> bool:
        return key in self._prompts

    def keys(self) -> set[PromptKey]:
        return set(self._prompts)

    def clear(self) -> None:
        self._prompts.clear()

    def touch(self, keys: list[PromptKey]) -> None:
        """Mark kept prompts most recently used: a refill's copies, before its fresh reads are kept. A refill admits
        at most `capacity` rows, so its fresh reads cannot then push out what its copies need."""
        for key in keys:
            if key in self._prompts:
                self._prompts.move_to_end(key)

    def remember(self, key: PromptKey, cache: Any, row: int, first: int, logits: Tensor) -> None:
        """Keep row `row` of a prefill's HF cache from column `first` (its prompt without the left padding)."""
        self._prompts[key] = _CachedPrompt(
            keys=[layer.keys[row : row + 1, :, first:].clone() for layer in cache.layers],
            values=[layer.values[row : row + 1, :, first:].clone() for layer in cache.layers],
            logits=logits.clone(),
        )
        self._prompts.move_to_end(key)
        while len(self._prompts) > self.capacity:
            self._prompts.popitem(last=False)

    def rows(self, keys: list[PromptKey], device: torch.device) -> tuple[Any, Tensor, Tensor]:
        """The kept prompts' rows left-padded to a common width: a cache with the HF cache's `layers[i].keys` and
        `.values` (what the engine merges into its running batch), their attention mask and last logits."""
        entries = [self._prompts[k] for k in keys]
        for key in keys:
            self._prompts.move_to_end(key)
        self.hits += len(keys)
        pads = [max(map(len, keys)) - len(k) for k in keys]
        padded = list(zip(entries, pads, strict=True))
        layers = [
            SimpleNamespace(keys=torch.cat([left_pad(e.keys[i], pad, -2) for e, pad in padded]),
                            values=torch.cat([left_pad(e.values[i], pad, -2) for e, pad in padded]))
            for i in range(len(entries[0].keys))
        ]
        mask = torch.stack([left_pad(torch.ones(len(k), dtype=torch.int64), pad, -1)
                            for k, pad in zip(keys, pads, strict=True)]).to(device)
        return SimpleNamespace(layers=layers), mask, torch.stack([e.logits for e in entries])

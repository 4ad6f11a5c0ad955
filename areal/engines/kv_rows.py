"""The rows of a left-padded batch KV cache, edited between decode steps: building token rows, keeping some rows,
appending others, trimming padding. A cache here is anything with `layers[i].keys` / `.values` of shape
[rows, heads, columns, head dim] (an HF DynamicCache, or the prompt cache's copies), its mask [rows, columns]."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def left_pad(x: Tensor, n: int, dim: int) -> Tensor:
    """Prepend n zeros along dim (a negative dim, counted from the end)."""
    if n == 0:
        return x
    pad = [0, 0] * (-dim - 1) + [n, 0]
    return F.pad(x, pad)


def left_padded(rows: Sequence[Tensor], pad_token_id: int) -> tuple[Tensor, Tensor]:
    """Token rows left-padded to the longest: their ids and attention mask, [rows, width] each."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.int64)
    mask = torch.zeros(len(rows), width, dtype=torch.int64)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = r
        mask[i, width - len(r) :] = 1
    return ids, mask


def select_rows(cache: Any, index: Tensor) -> None:
    """Keep only the given rows of every layer (an index may repeat a row: its copies)."""
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys[index], layer.values[index]


def append_rows(cache: Any, mask: Tensor, new: Any, new_mask: Tensor) -> Tensor:
    """Append `new`'s rows to `cache` in place, left-padding whichever is narrower; the mask of the whole."""
    width = max(mask.shape[1], new_mask.shape[1])
    pad_old, pad_new = width - mask.shape[1], width - new_mask.shape[1]
    for old, added in zip(cache.layers, new.layers, strict=True):
        old.keys = torch.cat([left_pad(old.keys, pad_old, -2), left_pad(added.keys, pad_new, -2)])
        old.values = torch.cat([left_pad(old.values, pad_old, -2), left_pad(added.values, pad_new, -2)])
    return torch.cat([left_pad(mask, pad_old, -1), left_pad(new_mask, pad_new, -1)])


def trim_padding(cache: Any, mask: Tensor) -> Tensor:
    """Drop the leading columns that are padding in every row, from the cache in place; the mask without them."""
    first = int(mask.any(0).to(torch.int64).argmax())
    if not first:
        return mask
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
    return mask[:, first:]

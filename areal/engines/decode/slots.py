"""The slot cache: K/V and per-slot decode state for `max_batch` rows, allocated once and written in place.

Slot i holds one request's K/V in columns 0..positions[i]-1 and the token it feeds next at positions[i]. A
newcomer takes the lowest free slot and its prompt's K/V are written there (by a prefill, or copied from a kept
prompt); a finished row just frees its slot. Nothing running is concatenated, re-padded or copied, so a decode
step's cost does not depend on how many rows came and went. The eager decode step runs over the slots in use
below `high` (a replayed graph over all of 0..`high`-1, free ones decoded and ignored), and reads each slot only up
to its own filled length.

Columns grow (by doubling) when a request needs more than the cache holds; each growth bumps `generation`, so
whatever captured the old tensors (CUDA graphs) knows to capture again.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from areal.engines.lists import list_tensor


class SlotKV:
    """K/V [layers, 2, slots, kv heads, columns, head dim] and the decode state of each slot (on `device`).

    `by_column` stores a slot's K and V of every kv head at one column side by side (a view gives the same shape):
    the CPU kernels then read a row's columns as one stream, not one a head for keys and values each (2-7 % faster
    decoding at the tiny coder's shape, the same bits); the torch ops' attention views the usual layout as it is
    (this one it would copy). The kernels read only columns a row wrote, so that cache is not zeroed: zeroing it
    (33 MB for 128 slots) and faulting in pages no row touches (a group's other slots never write its prompt's
    columns) was 3 % of a 128-row generate. The torch ops' masked attention reads every column, so theirs is."""

    def __init__(self, *, layers: int, kv_heads: int, head_dim: int, slots: int, dtype: torch.dtype,
                 device: torch.device, columns: int = 64, uniforms: int = 64, by_column: bool = False) -> None:
        self._shape = (layers, 2, slots, kv_heads, head_dim)
        self.by_column = by_column
        self.dtype, self.device = dtype, device
        self.kv = self._empty(columns)
        self.slots = slots
        self.generation = 0  # bumped whenever a tensor below is reallocated
        # rows of one tensor, so that freeing or filling slots sets all four in one op
        self._state = torch.zeros(4, slots, dtype=torch.int64, device=device)
        # the token each slot feeds next; its position (= the slot's filled columns); the output tokens it sampled
        # so far (the index of its next uniform); 1 where a request runs, 0 where the slot is free
        self.pending, self.positions, self.produced, self.live = self._state
        self.uniforms = torch.zeros(slots, uniforms, dtype=torch.float64, device=device)  # each request's stream
        self._free = list(range(slots))  # kept sorted: newcomers take the lowest
        self.high = 0  # one past the highest slot in use
        self.moves = 0  # bumped whenever a slot is taken or freed: what runs where may have changed

    def _empty(self, columns: int) -> Tensor:
        layers, two, slots, kv_heads, head_dim = self._shape
        if self.by_column:  # stored [layers, slots, columns, 2, kv heads, head dim], seen in the usual order
            stored = torch.empty(layers, slots, columns, two, kv_heads, head_dim, dtype=self.dtype, device=self.device)
            return stored.permute(0, 3, 1, 4, 2, 5)
        return torch.zeros(layers, two, slots, kv_heads, columns, head_dim, dtype=self.dtype, device=self.device)

    @property
    def columns(self) -> int:
        return self.kv.shape[4]

    @property
    def free(self) -> int:
        return len(self._free)

    def reserve(self, columns: int, uniforms: int) -> bool:
        """Room for `columns` positions a slot and `uniforms` draws a request; True when something was reallocated."""
        grown = False
        if columns > self.columns:
            wider = self._empty(max(columns, 2 * self.columns))
            if self.high:  # what the slots in use hold (a cache with none in use is grown empty)
                wider[..., : self.columns, :] = self.kv
            self.kv, grown = wider, True
        if uniforms > self.uniforms.shape[1]:
            wider_u = torch.zeros(self.slots, max(uniforms, 2 * self.uniforms.shape[1]), dtype=torch.float64,
                                  device=self.device)
            wider_u[:, : self.uniforms.shape[1]] = self.uniforms
            self.uniforms, grown = wider_u, True
        self.generation += grown
        return grown

    def take(self, count: int) -> list[int]:
        """The `count` lowest free slots, now in use."""
        taken, self._free = self._free[:count], self._free[count:]
        self.high = max([self.high, *(s + 1 for s in taken)])
        self.moves += 1
        return taken

    def release(self, slots: list[int]) -> None:
        """Free these slots; their state is zeroed so a free slot decodes harmlessly (its results ignored)."""
        if not slots:
            return
        self._state.index_fill_(1, list_tensor(slots, torch.int64, self.device), 0)
        self._free = sorted(self._free + slots)
        high, last = self.slots, len(self._free) - 1
        while last >= 0 and self._free[last] == high - 1:  # the free slots at the top
            high, last = high - 1, last - 1
        self.high = high
        self.moves += 1

    def start(self, slots: list[int], pending: list[int], positions: list[int], produced: list[int],
              uniforms: list[Tensor]) -> None:
        """Set the decode state of newly filled slots: the token each feeds next, its position, its draws (a 1-D
        tensor a slot)."""
        index = list_tensor(slots, torch.int64, self.device)
        self._state[:, index] = list_tensor([pending, positions, produced, [1] * len(slots)], torch.int64, self.device)
        draws = pad_sequence(uniforms, batch_first=True)  # one copy of them all: a refill's cost was one per row
        self.uniforms[index, : draws.shape[1]] = draws.to(self.device, torch.float64)

    def put_rows(self, slot: int, rows: Tensor) -> None:
        """Write a prompt's K/V ([layers, 2, kv heads, length, head dim]) into a slot's first columns."""
        self.kv[:, :, slot, :, : rows.shape[3]] = rows

    def rows(self, slot: int, length: int) -> Tensor:
        """A copy of a slot's first `length` columns of K/V: [layers, 2, kv heads, length, head dim]."""
        return self.kv[:, :, slot, :, :length].clone()

    def copy_rows(self, source: int, targets: list[int], length: int) -> None:
        """Copy a slot's first `length` columns into other slots (a prompt shared by a group)."""
        index = list_tensor(targets, torch.int64, self.device)
        self.kv[:, :, index, :, :length] = self.kv[:, :, source : source + 1, :, :length]

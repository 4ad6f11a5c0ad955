"""Batches: what flows along the edges of a graph.

A `Batch` is S samples held column-wise: each field is a tensor whose first dim is S
(per-sample), a `Ragged` (per-token: all samples' tokens packed end to end, with offsets),
or a list of S plain objects (json ports). Column-wise keeps the wire zero-copy (one frame
per field) and lets kernels work on packed tokens without padding.

The runtime owns three fields: `sample_id` (int64[S], unique and stable across retries),
`group_id` (int64[S]) and `versions` (Ragged int32: the policy version of each output token).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

RUNTIME_FIELDS = ("sample_id", "group_id", "versions")


@dataclass(frozen=True, eq=False)
class Ragged:
    """Variable-length rows packed end to end: row i is values[offsets[i]:offsets[i+1]]."""

    values: Tensor  # [N, ...] packed rows
    offsets: Tensor  # [S+1] int64, offsets[0] == 0, offsets[-1] == N

    def __post_init__(self) -> None:
        if self.offsets.dtype != torch.int64 or self.offsets.dim() != 1 or len(self.offsets) == 0:
            raise ValueError("Ragged offsets must be a non-empty 1-D int64 tensor")
        if int(self.offsets[0]) != 0 or int(self.offsets[-1]) != self.values.shape[0]:
            raise ValueError(
                f"Ragged offsets span 0..{int(self.offsets[-1])} but values hold {self.values.shape[0]} rows"
            )

    @classmethod
    def from_rows(cls, rows: Sequence[Tensor], dtype: torch.dtype | None = None) -> Ragged:
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.int64)
        offsets = torch.zeros(len(rows) + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(lengths, 0)
        if rows:
            values = torch.cat([torch.as_tensor(r) for r in rows])
        else:
            values = torch.empty(0, dtype=dtype or torch.float32)
        return cls(values.to(dtype) if dtype is not None else values, offsets)

    @classmethod
    def cat(cls, parts: Sequence[Ragged]) -> Ragged:
        starts = [0]
        for part in parts[:-1]:
            starts.append(starts[-1] + part.values.shape[0])
        offsets = torch.cat([parts[0].offsets[:1]] + [p.offsets[1:] + s for p, s in zip(parts, starts)])
        return cls(torch.cat([p.values for p in parts]), offsets)

    @property
    def lengths(self) -> Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> Tensor:
        return self.values[int(self.offsets[i]) : int(self.offsets[i + 1])]

    def rows(self) -> list[Tensor]:
        return list(torch.split(self.values, self.lengths.tolist()))

    def padded(self, fill: float = 0) -> Tensor:
        """[S, longest, ...]: row i's values, then `fill` (for code that wants a rectangle; which places are real:
        `torch.arange(longest) < ragged.lengths[:, None]`)."""
        longest = int(self.lengths.max()) if len(self) else 0
        out = self.values.new_full((len(self), longest, *self.values.shape[1:]), fill)
        owner = self.sample_index()
        out[owner, torch.arange(self.values.shape[0]) - self.offsets[owner]] = self.values
        return out

    def __eq__(self, other: object) -> bool:
        """Whether two Raggeds hold the same rows. Against anything else it raises: `ragged != 0` reads as a
        per-token test, and a dataclass would answer it with one silent True."""
        if not isinstance(other, Ragged):
            raise TypeError(f"a Ragged compares only with a Ragged, not {type(other).__name__}: compare its .values "
                            "(every row's values packed end to end) or .padded() (a [rows, longest] tensor)")
        return torch.equal(self.offsets, other.offsets) and torch.equal(self.values, other.values)

    __hash__ = None  # type: ignore[assignment]  # equal by value, and tensors' values can change

    def select(self, index: Sequence[int]) -> Ragged:
        return Ragged.from_rows([self[i] for i in index], dtype=self.values.dtype)

    def sample_index(self) -> Tensor:
        """[N] int64: the row each packed value belongs to (to broadcast per-sample values)."""
        return torch.repeat_interleave(torch.arange(len(self)), self.lengths)


Field = Tensor | Ragged | list


def _rows(field: Field) -> int:
    return len(field) if not isinstance(field, Tensor) else (field.shape[0] if field.dim() else -1)


class Batch(Mapping[str, Field]):
    """S samples, column-wise. Immutable: nodes return new fields, `merge` adds them."""

    def __init__(self, fields: Mapping[str, Field]) -> None:
        sizes = {name: _rows(value) for name, value in fields.items()}
        if len(set(sizes.values())) > 1:
            shown = ", ".join(f"{k}={v}" for k, v in sizes.items())
            raise ValueError(f"batch fields disagree on the number of samples: {shown}")
        for name, value in fields.items():
            if not isinstance(value, (Tensor, Ragged, list)):
                raise TypeError(f"field {name!r}: expected a tensor, Ragged or list, got {type(value).__name__}")
        self._fields = dict(fields)
        self.size = next(iter(sizes.values()), 0)

    def __getitem__(self, name: str) -> Field:
        try:
            return self._fields[name]
        except KeyError:
            have = ", ".join(self._fields) or "nothing"
            raise KeyError(f"batch has no field {name!r} (it has: {have}; a node is given the fields its inputs "
                           "declare, plus sample_id and group_id)") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __repr__(self) -> str:
        return f"Batch(size={self.size}, fields={list(self._fields)})"

    def merge(self, new: Mapping[str, Field]) -> Batch:
        return Batch({**self._fields, **new})

    def only(self, names: Sequence[str]) -> Batch:
        return Batch({n: self[n] for n in names})

    def select(self, index: Sequence[int]) -> Batch:
        """The samples at `index`, in that order."""
        picked: dict[str, Field] = {}
        idx = torch.as_tensor(list(index), dtype=torch.int64)
        for name, value in self._fields.items():
            if isinstance(value, Ragged):
                picked[name] = value.select(index)
            elif isinstance(value, Tensor):
                picked[name] = value[idx]
            else:
                picked[name] = [value[i] for i in index]
        return Batch(picked)

    @classmethod
    def concat(cls, batches: Sequence[Batch]) -> Batch:
        """Stack batches that have the same fields (oldest first keeps the trainer's order)."""
        if not batches:
            return cls({})
        names = list(batches[0])
        for b in batches[1:]:
            if list(b) != names:
                raise ValueError(f"cannot concatenate batches with fields {names} and {list(b)}")
        out: dict[str, Field] = {}
        for name in names:
            parts = [b[name] for b in batches]
            if isinstance(parts[0], Ragged):
                out[name] = Ragged.cat(parts)  # type: ignore[arg-type]
            elif isinstance(parts[0], Tensor):
                out[name] = torch.cat(parts)  # type: ignore[arg-type]
            else:
                out[name] = [item for part in parts for item in part]  # type: ignore[union-attr]
        return cls(out)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per sample (for logging and tests, not for hot paths)."""
        return [{n: (v[i] if not isinstance(v, Tensor) else v[i]) for n, v in self._fields.items()}
                for i in range(self.size)]

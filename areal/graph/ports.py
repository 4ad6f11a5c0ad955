"""Typed ports: what a node reads and writes.

A port type is a dtype plus a symbolic shape over the dims S (samples), T (tokens) and
G (groups). A type whose shape holds T is per-token and travels as a `Ragged` field; one
without T is per-sample. `json` ports carry one msgpack-able object per sample (test cases,
task text) and are never tensors.

    Float["S"]          float32 per sample           (reward, advantage)
    Float["S", "T"]     float32 per token, ragged    (behav_logp)
    Int["S", "T"]       int64 per token, ragged      (output_ids)
    Json["S"]           one object per sample        (tests)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DIMS = ("S", "T", "G")
DTYPES = ("float32", "float64", "int64", "int32", "bool", "json")

Level = Literal["sample", "token"]


@dataclass(frozen=True)
class PortType:
    dtype: str
    dims: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r} (known: {', '.join(DTYPES)})")
        if not self.dims or self.dims[0] not in ("S", "G"):
            raise ValueError(f"a port shape starts with S or G, got {list(self.dims)}")
        for dim in self.dims:
            if dim not in DIMS and not (isinstance(dim, str) and dim.isdigit()):
                raise ValueError(f"unknown dim {dim!r} (use S, T, G or a fixed size like '4')")

    @property
    def level(self) -> Level:
        return "token" if "T" in self.dims else "sample"

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(self.dims)}]"


class _TypeFactory:
    """`Float["S", "T"]` builds PortType("float32", ("S", "T"))."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype

    def __getitem__(self, dims: str | tuple[str, ...]) -> PortType:
        return PortType(self.dtype, (dims,) if isinstance(dims, str) else tuple(dims))

    def __repr__(self) -> str:
        return f"<port type {self.dtype}>"


Float = _TypeFactory("float32")
Double = _TypeFactory("float64")
Int = _TypeFactory("int64")
Int32 = _TypeFactory("int32")
Bool = _TypeFactory("bool")
Json = _TypeFactory("json")


def parse_port_type(text: str) -> PortType:
    """Read back `str(PortType)`, e.g. 'float32[S,T]' (used by plans read from JSON)."""
    dtype, _, rest = text.partition("[")
    return PortType(dtype, tuple(d for d in rest.rstrip("]").split(",") if d))

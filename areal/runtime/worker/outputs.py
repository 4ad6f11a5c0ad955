"""What a node returned, checked against what it declared, before anything downstream sees it.

A node's outputs are its contract: every declared port, of the declared kind, dtype family,
number of dimensions and row count. Breaking it is a bug in the node, the same on every retry,
so it stops the run naming the node and the port (`NodeContractError`). A float value that is
NaN or infinite is data, not a bug: the sample it belongs to is failed with the node's name and
the reason, and the rest of the batch goes on (a NaN must never reach a loss or the weights).
Values are cast to the declared dtype first, so a reward of 1e39 (finite in Python, inf in
float32) is caught as what the trainer would see.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from areal.errors import NodeContractError
from areal.graph.batch import Batch, Ragged
from areal.graph.node import Node
from areal.graph.ports import PortType

TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64, "int32": torch.int32,
                "bool": torch.bool}


def checked_outputs(n: Node, batch: Batch, out: Mapping[str, Any]) -> tuple[dict[str, Any], dict[int, str]]:
    """`out` with each declared field cast to its port's dtype, and the rows to fail: row -> reason."""
    missing = [p for p in n.outputs if p not in out and p not in batch]
    if missing:
        raise NodeContractError(f"{n.describe()}: returned no '{missing[0]}' "
                                f"(declared outputs: {', '.join(n.outputs)})")
    checked: dict[str, Any] = {}
    failed: dict[int, str] = {}
    for port, value in out.items():
        ptype = n.outputs.get(port)
        if ptype is None:
            checked[port] = value  # undeclared extras ride along unchecked (nothing downstream can read them)
            continue
        try:
            checked[port] = _cast(ptype, value, batch.size)
        except ValueError as problem:
            raise NodeContractError(f"{n.describe()}: output '{port}' {problem}") from None
        for row, what in _non_finite_rows(checked[port]).items():
            failed.setdefault(row, f"output '{port}' is {what}")
    return checked, failed


def empty_outputs(n: Node) -> dict[str, Any]:
    """A node's declared outputs over no samples: what a batch that lost every row carries on instead of calling
    the node with nothing (its fields keep their types for the nodes and joins downstream)."""
    out: dict[str, Any] = {}
    for port, ptype in n.outputs.items():
        if ptype.dtype == "json":
            out[port] = []
            continue
        values = torch.empty(0, *(int(d) for d in ptype.dims if d.isdigit()), dtype=TORCH_DTYPES[ptype.dtype])
        out[port] = Ragged(values, torch.zeros(1, dtype=torch.int64)) if ptype.level == "token" else values
    return out


def _cast(ptype: PortType, value: Any, rows: int) -> Any:
    """The value as the port declares it; ValueError says how it differs."""
    if ptype.dtype == "json":
        if not isinstance(value, list):
            raise ValueError(f"is declared {ptype} and must be a list (one object per sample), "
                             f"got {type(value).__name__}")
        _rows(len(value), rows)
        return value
    token = ptype.level == "token"
    if token and isinstance(value, list):
        value = _rows_as_ragged(ptype, value)
    elif not token and isinstance(value, (list, np.ndarray)):
        value = _numbers_as_tensor(ptype, value)
    tensor = value.values if token and isinstance(value, Ragged) else value
    if token and not isinstance(value, Ragged):
        hint = (": a padded [samples, longest] tensor would count its padding as tokens" if isinstance(value, Tensor)
                else "")
        raise ValueError(f"is declared {ptype} (per token) and must be a Ragged or a list of each sample's values, "
                         f"got {type(value).__name__}{hint}; Ragged.from_rows(rows) makes one (areal.graph.batch)")
    if not isinstance(tensor, Tensor):
        raise ValueError(f"is declared {ptype} and must be a tensor (or a list or numpy array of one number a sample), "
                         f"got {type(value).__name__}")
    fixed = [int(d) for d in ptype.dims if d.isdigit()]
    want_dims = 1 + len(fixed)  # S (or the packed tokens of a Ragged), then the fixed sizes
    if tensor.dim() != want_dims or list(tensor.shape[1:]) != fixed:
        shape = "[" + ",".join(["N" if token else "S"] + [str(f) for f in fixed]) + "]"
        what = "its packed values must have" if token else "it must be a tensor of"
        raise ValueError(f"is declared {ptype}, so {what} shape {shape}; got shape {list(tensor.shape)}")
    _rows(len(value), rows)
    want = TORCH_DTYPES[ptype.dtype]
    if _family(tensor.dtype) != _family(want):
        raise ValueError(f"is declared {ptype} but holds {str(tensor.dtype).removeprefix('torch.')} values "
                         f"(a {_family(want)} port takes {_family(want)} values)")
    if tensor.dtype == want:
        return value
    cast = tensor.to(want)
    return Ragged(cast, value.offsets) if token else cast


def _rows_as_ragged(ptype: PortType, rows: list[Any]) -> Ragged:
    """A list of each sample's values (tensors or lists of numbers) as a Ragged of them."""
    try:
        tensors = [row if isinstance(row, Tensor) else torch.as_tensor(row, dtype=TORCH_DTYPES[ptype.dtype])
                   for row in rows]
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"is declared {ptype} (per token): its list must hold each sample's values, a tensor or a "
                         f"list of numbers ({err})") from None
    wrong = [t.dim() for t in tensors if t.dim() != 1 + sum(d.isdigit() for d in ptype.dims)]
    if wrong:
        raise ValueError(f"is declared {ptype} (per token): each sample's values must have one entry per token, got "
                         f"a {wrong[0]}-dimensional row")
    return Ragged.from_rows(tensors, dtype=None if tensors else TORCH_DTYPES[ptype.dtype])


def _numbers_as_tensor(ptype: PortType, value: list[Any] | np.ndarray) -> Tensor:
    """A list or numpy array of one value a sample as a tensor, checked as one below: ints and bools become floats
    for a float port (as a reward function's do); a float is never truncated into an int port."""
    try:
        tensor = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"is declared {ptype}: its {type(value).__name__} must hold numbers ({err})") from None
    if _family(TORCH_DTYPES[ptype.dtype]) == "float" and _family(tensor.dtype) in ("int", "bool"):
        return tensor.to(TORCH_DTYPES[ptype.dtype])
    return tensor


def _rows(got: int, rows: int) -> None:
    if got != rows:
        raise ValueError(f"has {got} rows for a batch of {rows}")


def _family(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    return "float" if dtype.is_floating_point else ("int" if not dtype.is_complex else "complex")


def _non_finite_rows(value: Any) -> dict[int, str]:
    """Row -> 'nan' or 'inf' for every sample holding a non-finite float (per token: any of its tokens)."""
    tensor = value.values if isinstance(value, Ragged) else value
    if not isinstance(tensor, Tensor) or not tensor.dtype.is_floating_point:
        return {}
    bad = ~torch.isfinite(tensor)
    if not bool(bad.any()):
        return {}
    nan = torch.isnan(tensor)
    if tensor.dim() > 1:
        bad, nan = bad.flatten(1).any(1), nan.flatten(1).any(1)
    if isinstance(value, Ragged):
        owner = value.sample_index()
        return {int(r): ("nan" if bool(nan[owner == r].any()) else "inf") for r in owner[bad].unique().tolist()}
    return {int(r): ("nan" if bool(nan[r]) else "inf") for r in torch.nonzero(bad).flatten().tolist()}

"""Python lists of numbers into tensors, the fast way: through numpy.

`torch.tensor(list)` inspects every element as a Python object, which costs 3x what numpy's array constructor
does on a list of plain ints or floats (20 ints: 11 us against 3.6 us on the development VM). The engines build
such tensors per step and per finished request (slot indices, token ids, log-probs, versions), so the host time of
a step goes down with it. Values and rounding are those of `torch.tensor` (a float list to float32 rounds to
nearest, as torch does)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

_NUMPY = {torch.int64: np.int64, torch.int32: np.int32, torch.float64: np.float64, torch.float32: np.float32}


def list_tensor(values: Sequence, dtype: torch.dtype, device: torch.device | None = None) -> Tensor:
    """A CPU tensor of `values` (a list of numbers, or of equal-length lists) as `dtype`, moved to `device`."""
    if dtype not in _NUMPY:
        raise ValueError(f"list_tensor: {dtype} is not one of {', '.join(map(str, _NUMPY))}")
    tensor = torch.from_numpy(np.array(values, dtype=_NUMPY[dtype]))
    return tensor if device is None or device.type == "cpu" else tensor.to(device)

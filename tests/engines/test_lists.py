"""list_tensor: the same tensor torch.tensor makes of a list, dtype and rounding included."""

import math

import pytest
import torch

from areal.engines.lists import list_tensor


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float64, torch.float32])
def test_a_list_becomes_the_tensor_torch_tensor_makes(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    if dtype.is_floating_point:  # float32 rounds each double to nearest, as torch does
        values = [math.pi * x for x in torch.randn(257, generator=g, dtype=torch.float64).tolist()]
    else:
        values = torch.randint(-(2**31), 2**31 - 1, (257,), generator=g).tolist()
    made = list_tensor(values, dtype)
    assert made.dtype == dtype and made.device.type == "cpu"
    assert torch.equal(made, torch.tensor(values, dtype=dtype))


def test_rows_of_equal_length_become_a_matrix_and_an_empty_list_an_empty_vector() -> None:
    rows = [[1, 2, 3], [4, 5, 6]]
    assert torch.equal(list_tensor(rows, torch.int64), torch.tensor(rows))
    empty = list_tensor([], torch.int64)
    assert empty.shape == (0,) and empty.dtype == torch.int64


def test_a_dtype_it_does_not_know_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="torch.bool is not one of torch.int64"):
        list_tensor([True], torch.bool)

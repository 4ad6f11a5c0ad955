"""A Ragged field as a node's code meets it: rows as a rectangle, and comparisons that say what they mean."""

import pytest
import torch

from areal.graph.batch import Ragged


def _rows() -> list[torch.Tensor]:
    return [torch.tensor([3, 1, 4]), torch.tensor([], dtype=torch.int64), torch.tensor([1, 5]), torch.tensor([9])]


@pytest.mark.parametrize("fill", [0, -100])
def test_padded_places_each_row_first_in_its_line_and_fills_the_rest(fill):
    rows = _rows()
    expected = torch.full((4, 3), fill, dtype=torch.int64)
    for i, row in enumerate(rows):
        expected[i, : len(row)] = row
    assert torch.equal(Ragged.from_rows(rows).padded(fill), expected)


def test_padded_keeps_each_tokens_trailing_dims():
    rows = [torch.randn(2, 5, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)]
    padded = Ragged.from_rows(rows).padded()
    assert padded.shape == (2, 4, 5) and padded.dtype == torch.float64
    assert torch.equal(padded[0, :2], rows[0]) and torch.equal(padded[0, 2:], torch.zeros(2, 5, dtype=torch.float64))
    assert torch.equal(padded[1], rows[1])


def test_padded_of_no_rows_is_empty():
    assert Ragged.from_rows([], dtype=torch.int64).padded().shape == (0, 0)


def test_raggeds_are_equal_when_their_rows_are():
    assert Ragged.from_rows(_rows()) == Ragged.from_rows(_rows())
    # the same values cut into other rows, or other values in the same rows: not equal
    assert Ragged.from_rows([torch.tensor([1, 2]), torch.tensor([3])]) != Ragged.from_rows(
        [torch.tensor([1]), torch.tensor([2, 3])])
    assert Ragged.from_rows([torch.tensor([1, 2])]) != Ragged.from_rows([torch.tensor([1, 3])])


@pytest.mark.parametrize("other", [0, torch.tensor(0), [3, 1, 4]])
def test_comparing_a_ragged_with_a_number_or_tensor_raises_and_says_what_to_compare(other):
    ragged = Ragged.from_rows(_rows())
    with pytest.raises(TypeError, match=r"\.values.*\.padded\(\)"):
        _ = ragged != other
    with pytest.raises(TypeError, match="compares only with a Ragged"):
        _ = ragged == other


def test_reading_a_field_the_batch_lacks_names_what_it_has_and_where_a_nodes_fields_come_from():
    from areal.graph.batch import Batch

    batch = Batch({"reward": torch.zeros(2), "group_id": torch.zeros(2, dtype=torch.int64)})
    with pytest.raises(KeyError, match=r"batch has no field 'output_ids' \(it has: reward, group_id; a node is given "
                                       r"the fields its inputs declare"):
        batch["output_ids"]

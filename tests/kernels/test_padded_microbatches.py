"""Micro-batches of right-padded rows: what a forward really holds stays under the budget, and the plan is
the cheapest of all ways to split the batch (checked against every partition of small batches)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal.kernels.packing import PackingError, padded_microbatches


def _cost(lengths: list[int], bins: list[list[int]], call_cost: int) -> int:
    return sum(len(b) * max(max(lengths[i], 1) for i in b) + call_cost for b in bins)


def _partitions(items: list[int]):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        yield [[first], *part]
        for k in range(len(part)):
            yield [*part[:k], [first, *part[k]], *part[k + 1:]]


@settings(max_examples=120, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=6), st.integers(40, 200), st.integers(0, 60))
def test_the_plan_is_the_cheapest_partition_and_fits_the_budget(lengths, budget, call_cost):
    bins = padded_microbatches(lengths, budget, call_cost)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(len(b) * max(lengths[i] for i in b) <= budget for b in bins)
    fitting = [p for p in _partitions(list(range(len(lengths))))
               if all(len(b) * max(lengths[i] for i in b) <= budget for b in p)]
    assert _cost(lengths, bins, call_cost) == min(_cost(lengths, p, call_cost) for p in fitting)


def test_sequences_of_like_length_share_a_microbatch_when_calls_are_cheap():
    lengths = [10, 50, 11, 49, 12, 48]
    assert padded_microbatches(lengths, 1000, call_cost=5) == [[1, 3, 5], [0, 2, 4]]  # longest first
    assert padded_microbatches(lengths, 1000, call_cost=1000) == [[0, 1, 2, 3, 4, 5]]  # one call is cheaper


def test_a_sequence_over_the_budget_is_named():
    with pytest.raises(PackingError, match="sequence 1 has 9 tokens, over the micro-batch budget of 8 tokens"):
        padded_microbatches([3, 9], 8, call_cost=0)

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal.errors import ConfigError
from areal.kernels.packing import PackingError, balance_across_ranks, pack_microbatches, padding_waste

budgets = st.integers(min_value=1, max_value=300)


@st.composite
def lengths_within(draw, max_items: int = 60):
    budget = draw(budgets)
    lengths = draw(st.lists(st.integers(min_value=0, max_value=budget), max_size=max_items))
    return lengths, budget


@settings(max_examples=150, deadline=None)
@given(lengths_within())
def test_packing_covers_every_index_once_and_never_exceeds_budget(case):
    lengths, budget = case
    bins = pack_microbatches(lengths, budget)
    flat = [i for b in bins for i in b]
    assert sorted(flat) == list(range(len(lengths)))
    assert all(b and sum(lengths[i] for i in b) <= budget for b in bins)
    # any-fit packing leaves at most one bin at most half full, so bins < 2·total/budget + 1
    assert len(bins) < 2 * sum(lengths) / budget + 1 + 1e-9
    assert len(bins) >= math.ceil(sum(lengths) / budget)


@settings(max_examples=100, deadline=None)
@given(lengths_within(), st.data())
def test_a_sequence_over_budget_raises_naming_it(case, data):
    lengths, budget = case
    index = data.draw(st.integers(min_value=0, max_value=len(lengths)))
    too_long = budget + data.draw(st.integers(min_value=1, max_value=50))
    lengths = lengths[:index] + [too_long] + lengths[index:]
    with pytest.raises(PackingError) as err:
        pack_microbatches(lengths, budget)
    assert (err.value.index, err.value.length, err.value.max_tokens) == (index, too_long, budget)
    assert f"sequence {index} has {too_long} tokens, over the micro-batch budget of {budget} tokens" in str(err.value)
    assert isinstance(err.value, ConfigError)  # a setting to change: a node's failure says it without areal's frames


def test_packing_balances_load_across_the_minimal_bin_count():
    # first-fit decreasing alone gives [5, 5] and [3, 3] (loads 10 and 6); same 2 bins, loads 8 and 8
    bins = pack_microbatches([5, 5, 3, 3], 10)
    assert sorted(sorted([5, 5, 3, 3][i] for i in b) for b in bins) == [[3, 5], [3, 5]]


def test_packing_lognormal_lengths_fills_the_budget():
    rng = random.Random(0)
    lengths = [min(int(rng.lognormvariate(6, 1)), 8192) for _ in range(512)]
    bins = pack_microbatches(lengths, 8192)
    fill = sum(lengths) / (len(bins) * 8192)
    assert len(bins) == math.ceil(sum(lengths) / 8192) and fill > 0.95


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=5000), max_size=80), st.integers(min_value=1, max_value=9))
def test_rank_balance_covers_every_index_once(lengths, n_ranks):
    ranks = balance_across_ranks(lengths, n_ranks)
    assert len(ranks) == n_ranks
    assert sorted(i for r in ranks for i in r) == list(range(len(lengths)))
    loads = [sum(lengths[i] for i in r) for r in ranks]
    assert max(loads) - min(loads) <= max(lengths, default=0)


def test_rank_balance_gap_on_heavy_tailed_lengths():
    rng = random.Random(1)
    lengths = [int(rng.lognormvariate(6, 1)) + 1 for _ in range(1024)]
    loads = [sum(lengths[i] for i in r) for r in balance_across_ranks(lengths, 8)]
    gap = max(loads) - min(loads)
    print(f"8 ranks, 1024 lognormal lengths: loads {min(loads)}..{max(loads)}, gap {gap} tokens")
    assert gap <= 0.001 * sum(loads) / 8


def test_padding_waste_counts_pad_to_longest_per_microbatch():
    # [4, 2] padded to 4 -> 8 slots, 6 real; [3] -> 3 slots, 3 real: waste = 2 / 11
    assert padding_waste([4, 2, 3], [[0, 1], [2]]) == pytest.approx(2 / 11)
    assert padding_waste([], []) == 0.0

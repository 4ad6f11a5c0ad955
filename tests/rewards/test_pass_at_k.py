"""The unbiased pass@k estimator against its closed form 1 − C(n−c, k)/C(n, k), in exact arithmetic."""

from __future__ import annotations

from fractions import Fraction
from math import comb

import pytest

from areal.rewards import mean_pass_at_k, pass_at_k


def closed_form(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(comb(n - c, k), comb(n, k))  # comb(a, k) is 0 when a < k


def test_matches_the_closed_form_on_every_small_case():
    for n in range(1, 21):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(float(closed_form(n, c, k)), abs=1e-12), (n, c, k)


def test_large_n_stays_finite_and_exact_where_binomials_overflow_a_float():
    # C(400, 200) ~ 1e119: a float ratio of the two binomials would be fine, but C(2000, 1000) is inf
    assert pass_at_k(400, 37, 200) == pytest.approx(float(closed_form(400, 37, 200)), rel=1e-12)
    assert 0.0 < pass_at_k(2000, 3, 1000) < 1.0
    assert pass_at_k(2000, 3, 1000) == pytest.approx(float(closed_form(2000, 3, 1000)), rel=1e-9)


def test_edge_cases():
    assert pass_at_k(10, 0, 5) == 0.0  # nothing correct
    assert pass_at_k(10, 10, 10) == 1.0
    assert pass_at_k(10, 6, 5) == 1.0  # n − c = 4 < k = 5: every draw of 5 holds a correct one
    assert pass_at_k(10, 5, 6) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is c/n
    # n=5, c=1, k=2: 1 − C(4,2)/C(5,2) = 1 − 6/10
    assert pass_at_k(5, 1, 2) == pytest.approx(0.4)


def test_the_benchmark_figure_is_the_mean_over_problems():
    assert mean_pass_at_k([(5, 1), (5, 0), (5, 5)], 2) == pytest.approx((0.4 + 0.0 + 1.0) / 3)


@pytest.mark.parametrize(("n", "c", "k"), [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)])
def test_impossible_counts_are_refused_with_the_values(n, c, k):
    with pytest.raises(ValueError, match=rf"got n={n}, c={c}, k={k}"):
        pass_at_k(n, c, k)

"""The unbiased pass@k estimator of Chen et al. (2021), computed without huge binomials.

From n samples of which c are correct, the probability that at least one of k samples drawn
without replacement is correct is 1 − C(n−c, k) / C(n, k). The ratio of binomials is the product
Π_{i=n−c+1..n} (1 − k/i), which stays in floating range for any n (C(200, 100) alone is ~9e58).
When fewer than k samples are wrong, every draw of k holds a correct one: pass@k = 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def pass_at_k(n: int, c: int, k: int) -> float:
    """Estimated pass@k of one problem with c correct out of n samples (1 <= k <= n, 0 <= c <= n)."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k: need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """The benchmark's pass@k: the mean over problems of pass_at_k(n, c, k), from (n, c) pairs."""
    values = [pass_at_k(n, c, k) for n, c in counts]
    if not values:
        raise ValueError("mean_pass_at_k: no problems")
    return sum(values) / len(values)

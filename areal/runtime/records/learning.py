"""Did the run learn? Held-out pass@1 with its standard error, and the gain from the first round to the last.

The held-out tasks are fixed, so a round's only randomness is the sampling: with k samples of each of T tasks
solved s_t times (p_t = s_t / k), the round's pass@1 is the mean of the p_t and its variance is
Σ_t p_t(1 − p_t) / (k − 1) / T² (each task's sample variance, unbiased, over its k draws). With one sample per
task a task's own spread cannot be seen, and the binomial p(1 − p) / T stands in (an upper bound). The gain's
error adds the two rounds' variances: they are independent draws. A run "learned" when its gain is more than
two standard errors above 0, "fell" when it is more than two below, and is "within noise" otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def pass_at_1_error(solved_per_task: Sequence[int], samples: int) -> float:
    """The standard error of pass@1 over these tasks, each sampled `samples` times."""
    tasks = len(solved_per_task)
    if not tasks:
        return math.nan
    rates = [s / samples for s in solved_per_task]
    if samples == 1:
        p = sum(rates) / tasks
        return math.sqrt(p * (1 - p) / tasks)
    return math.sqrt(sum(p * (1 - p) / (samples - 1) for p in rates)) / tasks


def verdict(first: dict[str, Any], last: dict[str, Any]) -> str:
    """'+15.4 ± 1.8 points: learned' from two eval records (pass@1 and pass@1_se)."""
    gain = 100 * (last["pass@1"] - first["pass@1"])
    error = 100 * math.sqrt(first.get("pass@1_se", math.nan) ** 2 + last.get("pass@1_se", math.nan) ** 2)
    if math.isnan(error):
        return f"{gain:+.1f} points"
    word = "learned" if gain > 2 * error else "fell" if gain < -2 * error else "within noise"
    return f"{gain:+.1f} ± {error:.1f} points: {word}"

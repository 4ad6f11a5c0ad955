"""The axes of the page's curves, worked out by the server (where a test can check them) and sent with the metrics.

An axis holds its data and nothing absurd: ticks at round steps (1, 2, 2.5 or 5 times a power of ten), a count
or a version only at whole numbers, a fraction (held-out pass@1, the solved share) always from 0 to 1, and a
rate or a count never below 0. One point makes no range of its own: it gets one around it, cut at those bounds
(a pass@1 of 0.25 alone is drawn on 0..1, not on -0.25..0.75). The page draws what it is given.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

TICKS = 4  # about this many labels an axis


def axis(values: Iterable[float | None], *, floor: float | None = None, ceiling: float | None = None,
         whole: bool = False, fraction: bool = False) -> dict[str, Any]:
    """{"min", "max", "ticks", "labels"} of an axis that holds `values` (None and non-finite ones left out)."""
    if fraction:
        floor, ceiling = 0.0, 1.0
    data = [float(v) for v in values if v is not None and math.isfinite(v)]
    lo, hi = (min(data), max(data)) if data else (floor if floor is not None else 0.0, 1.0)
    if fraction:
        lo, hi = 0.0, 1.0
    if hi - lo < 1e-12:  # one value: a range around it
        pad = 1.0 if whole else max(abs(lo) * 0.5, 0.5)
        lo, hi = lo - pad, hi + pad
    step = _step((hi - lo) / (TICKS - 1), whole)
    lo, hi = math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step
    if floor is not None:
        lo = max(lo, floor)
    if ceiling is not None:
        hi = min(hi, ceiling)
    first = math.ceil(lo / step - 1e-9)
    ticks = [round(k * step, 10) for k in range(first, math.floor(hi / step + 1e-9) + 1)]
    decimals = 0 if whole else max(0, -math.floor(math.log10(step) + 1e-9) + (1 if _mantissa(step) == 2.5 else 0))
    return {"min": round(lo, 10), "max": round(hi, 10), "ticks": ticks,
            "labels": [f"{t:.{decimals}f}" for t in ticks]}


def chart_axes(lines: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per chart of the page (its svg id), its x and y axes, from the metrics lines the page draws."""
    steps = [m for m in lines if m.get("kind") == "step"]
    evals = [m for m in lines if m.get("kind") == "eval"]
    lagged = [m for m in steps if m.get("staleness")]
    versions = [m.get("version") for m in steps]
    return {
        "c-reward": {"x": axis(versions, floor=0, whole=True),
                     "y": axis([m.get(k) for m in steps for k in ("reward_mean", "solved")])},
        "c-pass": {"x": axis([m.get("version") for m in evals], floor=0, whole=True),
                   "y": axis([m.get("pass@1") for m in evals], fraction=True)},
        "c-rate": {"x": axis(versions, floor=0, whole=True),
                   "y": axis([m.get("samples_per_s") for m in steps], floor=0)},
        "c-entropy": {"x": axis(versions, floor=0, whole=True),
                      "y": axis([m.get("entropy") for m in steps], floor=0)},
        "c-lag": {"x": axis([m.get("version") for m in lagged], floor=0, whole=True),
                  "y": axis([0, *(sum(m["staleness"].values()) for m in lagged)], floor=0, whole=True)},
    }


def _step(raw: float, whole: bool) -> float:
    """The round step at or above `raw`: 1, 2, 2.5 or 5 times a power of ten (a whole number on a whole axis)."""
    if raw <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        step = m * power
        if step >= raw * (1 - 1e-9) and (not whole or (step >= 1 and float(step).is_integer())):
            return step
    return max(10 * power, 1.0)


def _mantissa(step: float) -> float:
    return round(step / 10.0 ** math.floor(math.log10(step)), 6)

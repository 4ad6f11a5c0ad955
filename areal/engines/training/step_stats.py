"""A step's numbers, each combined over micro-batches, minibatches and ranks the way its kind says.

A loss function returns numbers about its micro-batch; the engine, the trainer's minibatches and a
trainer's ranks combine them into one step record. A count (`Total`: tokens kept, tokens capped)
is summed, a maximum (`Peak`) is the largest, and any other number is a mean over the micro-batch's
output tokens, so the step's is weighted by tokens: what a plain token-weighted mean of every number
would get wrong is a count (414 tokens read as 285.16) and a maximum.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping


class Total(float):
    """A count: the step's is the sum of its parts'."""


class Peak(float):
    """A maximum: the step's is the largest of its parts'."""


def kinds_kept(value: float) -> float:
    """A number as a plain float, or as the Total or Peak it was marked."""
    return value if isinstance(value, (Total, Peak)) else float(value)


def kind_of(value: float) -> str:
    return "total" if isinstance(value, Total) else "peak" if isinstance(value, Peak) else "mean"


class StepStats:
    """Numbers of parts (micro-batches, minibatches), each part weighted by its tokens where the number is a mean."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}  # totals and weighted means' numerators
        self.peaks: dict[str, float] = {}
        self.weights: dict[str, float] = {}  # a mean's tokens
        self.kinds: dict[str, str] = {}

    def add(self, numbers: Mapping[str, float], tokens: float, counted: bool = True) -> None:
        """One part's numbers; `counted=False` (an FSDP rank's padding micro-batch) names them and adds nothing."""
        for name, value in numbers.items():
            kind = self.kinds.setdefault(name, kind_of(value))
            if kind == "peak":
                now = self.peaks.get(name, float("-inf"))
                self.peaks[name] = max(now, float(value)) if counted else now
            elif kind == "total":
                self.sums[name] = self.sums.get(name, 0.0) + (float(value) if counted else 0.0)
            else:
                self.sums[name] = self.sums.get(name, 0.0) + (float(value) * tokens if counted else 0.0)
                self.weights[name] = self.weights.get(name, 0.0) + (tokens if counted else 0.0)

    def reduce(self, sum_over: Callable[[list[float]], list[float]],
               max_over: Callable[[list[float]], list[float]]) -> None:
        """Combine with the other ranks' (each calls it with the same names): sums and weights summed, peaks maxed."""
        sums, weights, peaks = sorted(self.sums), sorted(self.weights), sorted(self.peaks)
        summed = sum_over([self.sums[n] for n in sums] + [self.weights[n] for n in weights])
        self.sums, self.weights = dict(zip(sums, summed[: len(sums)])), dict(zip(weights, summed[len(sums):]))
        self.peaks = dict(zip(peaks, max_over([self.peaks[n] for n in peaks])))

    def result(self) -> dict[str, float]:
        """Each number as its kind combines it, still marked with its kind (so the next level combines it too)."""
        out: dict[str, float] = {}
        for name, kind in self.kinds.items():
            if kind == "peak":
                out[name] = Peak(self.peaks[name])
            elif kind == "total":
                out[name] = Total(self.sums[name])
            else:
                out[name] = self.sums[name] / self.weights[name] if self.weights[name] else 0.0
        return out


def combined(parts: Iterable[tuple[Mapping[str, float], float]]) -> dict[str, float]:
    """The step's numbers from (numbers, tokens) parts."""
    stats = StepStats()
    for numbers, tokens in parts:
        stats.add(numbers, tokens)
    return stats.result()

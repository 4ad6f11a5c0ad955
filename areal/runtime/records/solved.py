"""What counts a sample solved, in one place: its `eval.solved` field (default: the reported reward) at least
`eval.solved_at` (default 1.0). Step records' `solved`, held-out pass@1 and `areal eval` all count with it, so a
weighted reward (0.7 for a passing program, 0.3 for style) reports its mean while pass@1 counts what passed."""

from __future__ import annotations

from collections.abc import Iterable

TOLERANCE = 1e-9  # a reward of 1 computed as a sum of thirds still counts


def solved(values: Iterable[float], at: float = 1.0) -> list[bool]:
    return [float(v) >= at - TOLERANCE for v in values]

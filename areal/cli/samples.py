"""`areal samples` as a table: one row per sample, its id, status, step and lag, its text fields cut to fit,
and each node's numbers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from rich.table import Table

from areal.runtime.records.sample_records import STATUSES, SampleRecord

TEXT_WIDTH = 40  # characters of a prompt or completion shown in a cell


def samples_table(every: Iterable[SampleRecord], chosen: list[SampleRecord], page: list[SampleRecord],
                  offset: int) -> Table:
    counts = Counter(r.status for r in every)
    title = (f"{sum(counts.values())} samples: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s])
             + f" · {len(chosen)} match, showing {offset + 1 if page else 0}-{offset + len(page)}")
    columns = sorted({name for r in page for name, v in r.fields.items() if _shown(v)}, key=_order)
    t = Table(title=title, show_lines=False)
    for name in ("id", "group", "status", "step", "lag", *columns, "why"):
        t.add_column(name, overflow="fold", max_width=TEXT_WIDTH if name in columns else None)
    for r in page:
        cells = [_cell(r.fields.get(name)) for name in columns]
        why = f"{r.node}: {r.reason}" if r.reason else ""
        t.add_row(str(r.sample_id), _cell(r.group_id), r.status, _cell(r.step), _cell(r.lag), *cells, why)
    return t


def _shown(value: object) -> bool:
    """Text and numbers get a column; a per-token summary shows as its mean (or its length)."""
    return isinstance(value, (str, int, float, dict))


def _order(name: str) -> tuple[int, str]:
    """Text first (what was asked and answered), then numbers, each by node."""
    return (0 if name.endswith((".prompt", ".completion", ".transcript")) else 1, name)


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        inner = value.get("mean", value.get("tokens"))
        return f"{inner:.4g}" if isinstance(inner, float) else str(inner)
    text = str(value).replace("\n", "⏎")
    return text if len(text) <= TEXT_WIDTH * 2 else text[: TEXT_WIDTH * 2 - 1] + "…"

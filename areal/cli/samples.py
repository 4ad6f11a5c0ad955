"""`areal samples` on a terminal: one block per sample, so that it reads at 80 columns as well as at 200.

A block's heading says the sample's id, group and fate (trained at step N with lag L, failed, ...); then one line
per text field (prompt, completion, transcript: newlines shown as ⏎, cut with … at the terminal's edge), one line
per node with that node's numbers, and why it failed or was filtered. A table with a column per field was
unreadable at 80 columns (every cell folded into a strip of a few characters); `--json` gives every field whole.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from areal.models.chat import is_chat
from areal.runtime.records.sample_records import STATUSES, SampleRecord

TEXT_CHARS = 400  # of a text field kept before the terminal's edge cuts it: a line, never a page


def samples_table(every: Iterable[SampleRecord], chosen: list[SampleRecord], page: list[SampleRecord],
                  offset: int, ended: bool = False) -> RenderableType:
    """`ended`: the run is over, so a sample with no verdict will never have one (it was in flight at the stop)."""
    counts = Counter(r.status for r in every)
    named = {"pending": "unfinished (in flight when the run stopped)"} if ended else {}
    title = (f"{sum(counts.values())} samples: "
             + ", ".join(f"{counts[s]} {named.get(s, s)}" for s in STATUSES if counts[s])
             + f" · {len(chosen)} match, showing {offset + 1 if page else 0}-{offset + len(page)}")
    blocks: list[RenderableType] = [Text(title, style="bold")]
    for r in page:
        blocks += [Text(_heading(r, ended), style="bold cyan"), Padding(_fields(r), (0, 0, 0, 2))]
    return Group(*blocks)


def _heading(r: SampleRecord, ended: bool) -> str:
    status = "unfinished" if ended and r.status == "pending" else r.status
    fate = status if r.step is None else f"{status} at step {r.step}, lag {_cell(r.lag)}"
    return f"sample {r.sample_id} · group {_cell(r.group_id)} · {fate}"


def _fields(r: SampleRecord) -> Table:
    """Name, value: one line each, the value cut with … where the terminal ends."""
    shown = {name: v for name, v in r.fields.items() if _shown(v)}
    names = [name for name in shown if _is_text(name, shown[name])]
    names += [name.rpartition(".")[0] for name in shown if not _is_text(name, shown[name])] + ["why"]
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True, style="dim", min_width=max(map(len, names)))  # names whole: values are cut
    grid.add_column()  # wrappable, so that the grid narrows it to the terminal; each value is one line (_line)
    for name in (n for n, v in shown.items() if _is_text(n, v)):  # in the order the run recorded them
        grid.add_row(name, _line(_cell(shown[name])))
    numbers: dict[str, list[str]] = {}
    for name in (n for n, v in shown.items() if not _is_text(n, v)):
        node, _, field = name.rpartition(".")
        numbers.setdefault(node, []).append(f"{field} {_cell(shown[name])}")
    for node, values in numbers.items():
        grid.add_row(node, _line(" · ".join(values)))
    if r.reason:
        grid.add_row("why", _line(f"{r.node}: {r.reason}"))
    return grid


def _line(text: str) -> Text:
    return Text(text, no_wrap=True, overflow="ellipsis")


def _shown(value: object) -> bool:
    """Text, chat messages and numbers are shown; a per-token summary shows as its mean (or its length)."""
    return isinstance(value, (str, int, float, dict)) or is_chat(value)


def _is_text(name: str, value: object) -> bool:
    return isinstance(value, str) or name.endswith((".prompt", ".completion", ".transcript"))


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        inner = value.get("mean", value.get("tokens"))
        return f"{inner:.4g}" if isinstance(inner, float) else str(inner)
    if is_chat(value):  # a prompt of chat messages
        value = "\n".join(f"{m['role']}: {m['content']}" for m in value)
    text = str(value).replace("\n", "⏎")
    return text if len(text) <= TEXT_CHARS else text[: TEXT_CHARS - 1] + "…"

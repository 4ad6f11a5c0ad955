"""Drawing a graph: a rich tree for the terminal, DOT/SVG/HTML pictures for files.

Given the runtime's `PlanView` (what `areal viz` passes), a picture shows the graph as it runs:
one frame per pool with its nodes, one arrow per channel with the fields it carries, parallel
branches side by side, and each asynchronous edge labelled with its staleness bound η: the
source's gate into generation and every weights route (dashed). Without one it shows the
declared graph alone. SVG uses Graphviz's `dot` when it is installed and falls back to the
self-contained layout of `layout.py` otherwise; both draw the same `Picture`.
"""

from __future__ import annotations

import html
import shutil
import subprocess
from pathlib import Path

from rich.console import Group as RichGroup
from rich.markup import escape
from rich.tree import Tree

from areal.graph.graph import Graph
from areal.graph.layout import INK, PILL_FILL, layered_svg
from areal.graph.picture import Arrow, Box, Picture, PlanView, picture

KIND_STYLE: dict[str, tuple[str, str, str]] = {  # kind -> (fill colour, dot shape, rich colour)
    "source": ("#e8f1fb", "cylinder", "blue"),
    "generate": ("#e6f6ea", "box", "green"),
    "episode": ("#e3f4f4", "box3d", "cyan"),
    "reward": ("#fff4dd", "hexagon", "yellow"),
    "compute-logprob": ("#f3e9fb", "box", "magenta"),
    "ppo-update": ("#fde8e8", "doubleoctagon", "red"),
    "custom": ("#f2f2f2", "ellipse", "white"),
}


def terminal_tree(graph: Graph, view: PlanView | None = None) -> RichGroup:
    """Nodes in data order with their ports, producers, pool and the weight route."""
    title = f"[bold]graph {graph.name}[/]  ({len(graph.nodes)} nodes"
    title += f" in {len(view.pools)} pools)" if view is not None else ")"
    tree = Tree(title)
    pool_of = {n: p for p in (view.pools if view else ()) for n in p.nodes}
    routes = {(r.src, r.dst): r.bound for r in view.routes} if view else {}
    control = {(c.src, c.dst) for c in graph.control_edges()}
    for n in graph.topological():
        colour = KIND_STYLE[n.kind][2]
        pool = pool_of.get(n.name)
        kind = f"({n.kind}) in pool {pool.name}" if pool else f"({n.kind}{f' ×{n.pool}' if n.pool else ''})"
        branch = tree.add(f"[bold {colour}]{n.name}[/] [dim]{escape(kind)}  {n.where or ''}[/]")
        for port, ptype in n.inputs.items():
            src = graph.resolve(n, port)
            origin = (f"{src[0].name}.{src[1]}" if src else
                      "[dim]none (optional)[/]" if port in n.spec.optional else "[red]unresolved[/]")
            branch.add(f"in  {port}: {ptype}  ← {origin}")
        for port, ptype in n.outputs.items():
            branch.add(f"out {port}: {ptype}")
        for src, dst in sorted(control):
            if dst == n.name:
                bound = routes.get((src, dst))
                branch.add(f"[dim]weights ⇠ {src} ({bound or 'control edge'})[/]")
        if pool is not None and pool.nodes[0] == n.name:
            for c in (c for c in view.channels if c.dst == pool.name and c.bound) if view else ():
                branch.add(f"[dim]gate ⇠ {c.src} ({c.bound})[/]")
    parts: list = [tree]
    if view is not None and view.summary:
        parts.append(f"[dim]{escape(view.summary)}[/]")
    return RichGroup(*parts)


def to_dot(graph: Graph, view: PlanView | None = None, heading: bool = True) -> str:
    """`heading`: the staleness summary as the graph's label (a page that shows it itself leaves it out)."""
    pic = picture(graph, view)
    lines = [
        f'digraph "{_esc(pic.title)}" {{',
        "  rankdir=TB; compound=true; node [fontname=Helvetica, style=filled]; "
        "edge [fontname=Helvetica, fontsize=10]; fontname=Helvetica;",
    ]
    if heading and pic.summary:
        lines.append(f'  labelloc=t; labeljust=l; fontsize=12; label="{_esc(pic.summary)}";')
    cluster_id = {c.name: f"cluster_{i}" for i, c in enumerate(pic.clusters)}
    for c in pic.clusters:
        body = [_dot_box(pic.boxes[b]) for b in c.boxes]
        if not c.framed:
            lines += [f"  {line}" for line in body]
            continue
        lines.append(f'  subgraph {cluster_id[c.name]} {{ id="pool-{_esc(c.name)}"; class="pool"; '
                     f'label=<<B>{html.escape(c.name)}</B> · {html.escape(c.caption)}>; labeljust=l; '
                     'style="rounded,filled"; fillcolor="#f7f8fa"; color="#8a94a6"; fontsize=12;')
        lines += [f"    {line}" for line in body]
        lines.append("  }")
    for a in pic.arrows:
        lines.append(f'  "{_esc(a.src)}" -> "{_esc(a.dst)}" [{_dot_arrow(a, pic, cluster_id)}];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_svg(graph: Graph, view: PlanView | None = None, heading: bool = True) -> str:
    dot = shutil.which("dot")
    if dot:
        done = subprocess.run([dot, "-Tsvg"], input=to_dot(graph, view, heading), capture_output=True, text=True,
                              timeout=30)
        if done.returncode == 0:
            return done.stdout
    return layered_svg(picture(graph, view), heading)


def to_html(graph: Graph, view: PlanView | None = None) -> str:
    legend = "".join(
        f'<span class="k" style="background:{fill}">{kind}</span>' for kind, (fill, _, _) in KIND_STYLE.items()
    )
    if view is not None:
        legend += ("<br><span class='k' style='background:#f7f8fa'>pool: one process per replica</span>"
                   f"<span style='color:{INK['gate']};font-weight:bold'>━ gated by η</span> &nbsp; ")
    legend += f"<span style='color:{INK['weights']}'>- - - weights (control edge)</span>"
    summary = f"<p class='s'>{html.escape(view.summary)}</p>" if view is not None and view.summary else ""
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>areal graph {html.escape(graph.name)}</title>"
        "<style>body{font-family:Helvetica,Arial,sans-serif;margin:24px}"
        ".k{display:inline-block;padding:2px 8px;margin:0 6px 4px 0;border:1px solid #999;border-radius:4px}"
        f".s{{color:{INK['gate']};background:{PILL_FILL['gate']};display:inline-block;padding:4px 10px;"
        "border-radius:10px}</style></head><body>"
        f"<h1>graph {html.escape(graph.name)}</h1><p>{legend}</p>{summary}"
        f"{_strip_xml_prolog(to_svg(graph, view, heading=False))}</body></html>\n"
    )


def write_picture(graph: Graph, out: Path, view: PlanView | None = None) -> str:
    """Write .dot, .svg or .html by suffix; return how it was drawn (for the CLI to say)."""
    suffix = out.suffix.lower()
    if suffix == ".dot":
        out.write_text(to_dot(graph, view))
        return "DOT text"
    if suffix == ".svg":
        out.write_text(to_svg(graph, view))
    elif suffix == ".html":
        out.write_text(to_html(graph, view))
    else:
        raise ValueError(f"{out}: unknown picture format '{suffix}' (use .svg, .dot or .html)")
    return "Graphviz dot" if shutil.which("dot") else "the built-in layout (install graphviz for dot's)"


def _dot_box(box: Box) -> str:
    fill, shape, _ = KIND_STYLE.get(box.kind, KIND_STYLE["custom"])
    label = f"{_esc(box.name)}\\n{_esc(box.caption)}"
    frozen = ', style="filled,dashed", penwidth=2' if box.frozen else ""
    return (f'"{_esc(box.name)}" [id="node-{_esc(box.name)}", label="{label}", shape={shape}, '
            f'fillcolor="{fill}"{frozen}];')


def _dot_arrow(a: Arrow, pic: Picture, cluster_id: dict[str, str]) -> str:
    lines = "<BR/>".join(html.escape(line) for line in a.label)
    ink = "weights" if a.kind == "weights" else "gate" if a.bound else "data"
    if a.bound:
        lines += f'<BR/><FONT COLOR="{INK[ink]}"><B>{html.escape(a.bound)}</B></FONT>'
    attrs = [f'id="{_esc(a.key)}"', f'class="{"channel gated" if ink == "gate" else a.kind}"', f"label=<{lines}>"]
    if a.kind == "weights":
        attrs += ["style=dashed", f'color="{INK[ink]}"', f'fontcolor="{INK[ink]}"', "constraint=false"]
    elif ink == "gate":
        attrs += [f'color="{INK[ink]}"', "penwidth=2"]
    src, dst = pic.cluster_of(a.src), pic.cluster_of(a.dst)
    if a.kind == "channel":  # drawn from frame to frame: the whole pool sends, the whole pool receives
        attrs += [f"ltail={cluster_id[src.name]}", f"lhead={cluster_id[dst.name]}"]
    return ", ".join(attrs)


def _esc(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _strip_xml_prolog(svg: str) -> str:
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg

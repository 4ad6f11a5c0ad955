"""Drawing a graph: a rich tree for the terminal, DOT/SVG/HTML pictures for files.

Node kinds get distinct colours and shapes, data edges carry their port names, and the weight
route (ppo-update -> generate / compute-logprob) is dashed, so a reader sees at once what
flows as data and what flows as weights. SVG uses Graphviz's `dot` when it is installed and
falls back to a self-contained layered drawing otherwise.
"""

from __future__ import annotations

import html
import shutil
import subprocess
from pathlib import Path

from rich.console import Group as RichGroup
from rich.tree import Tree

from areal.graph.graph import Graph

KIND_STYLE: dict[str, tuple[str, str, str]] = {  # kind -> (fill colour, dot shape, rich colour)
    "source": ("#e8f1fb", "cylinder", "blue"),
    "generate": ("#e6f6ea", "box", "green"),
    "episode": ("#e3f4f4", "box3d", "cyan"),
    "reward": ("#fff4dd", "hexagon", "yellow"),
    "compute-logprob": ("#f3e9fb", "box", "magenta"),
    "ppo-update": ("#fde8e8", "doubleoctagon", "red"),
    "custom": ("#f2f2f2", "ellipse", "white"),
}


def terminal_tree(graph: Graph) -> RichGroup:
    """Nodes in data order with their ports, producers and the weight route."""
    tree = Tree(f"[bold]graph {graph.name}[/]  ({len(graph.nodes)} nodes)")
    control = {(c.src, c.dst) for c in graph.control_edges()}
    for n in graph.topological():
        colour = KIND_STYLE[n.kind][2]
        pool = f" ×{n.pool}" if n.pool else ""
        branch = tree.add(f"[bold {colour}]{n.name}[/] [dim]({n.kind}{pool})  {n.where or ''}[/]")
        for port, ptype in n.inputs.items():
            src = graph.resolve(n, port)
            origin = (f"{src[0].name}.{src[1]}" if src else
                      "[dim]none (optional)[/]" if port in n.spec.optional else "[red]unresolved[/]")
            branch.add(f"in  {port}: {ptype}  ← {origin}")
        for port, ptype in n.outputs.items():
            branch.add(f"out {port}: {ptype}")
        for src, dst in sorted(control):
            if dst == n.name:
                branch.add(f"[dim]weights ⇠ {src} (control edge)[/]")
    return RichGroup(tree)


def to_dot(graph: Graph) -> str:
    lines = [
        f'digraph "{_esc(graph.name)}" {{',
        "  rankdir=TB; node [fontname=Helvetica, style=filled]; edge [fontname=Helvetica, fontsize=10];",
    ]
    for n in graph.nodes.values():
        fill, shape, _ = KIND_STYLE[n.kind]
        pool = f"\\npool ×{n.pool}" if n.pool else ""
        label = f"{_esc(n.name)}\\n({n.kind}){pool}"
        lines.append(f'  "{_esc(n.name)}" [label="{label}", shape={shape}, fillcolor="{fill}"];')
    for (src, dst), ports in _edge_labels(graph).items():
        lines.append(f'  "{_esc(src)}" -> "{_esc(dst)}" [label="{_esc(", ".join(ports))}"];')
    for c in graph.control_edges():
        lines.append(
            f'  "{_esc(c.src)}" -> "{_esc(c.dst)}" [label="weights", style=dashed, color="#c0392b", '
            'fontcolor="#c0392b", constraint=false];'
        )
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_svg(graph: Graph) -> str:
    dot = shutil.which("dot")
    if dot:
        done = subprocess.run([dot, "-Tsvg"], input=to_dot(graph), capture_output=True, text=True, timeout=30)
        if done.returncode == 0:
            return done.stdout
    return _layered_svg(graph)


def to_html(graph: Graph) -> str:
    legend = "".join(
        f'<span class="k" style="background:{fill}">{kind}</span>' for kind, (fill, _, _) in KIND_STYLE.items()
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>areal graph {html.escape(graph.name)}</title>"
        "<style>body{font-family:Helvetica,Arial,sans-serif;margin:24px}"
        ".k{display:inline-block;padding:2px 8px;margin-right:6px;border:1px solid #999;border-radius:4px}"
        "</style></head><body>"
        f"<h1>graph {html.escape(graph.name)}</h1><p>{legend}"
        "<span style='color:#c0392b'>- - - weights (control edge)</span></p>"
        f"{_strip_xml_prolog(to_svg(graph))}</body></html>\n"
    )


def write_picture(graph: Graph, out: Path) -> str:
    """Write .dot, .svg or .html by suffix; return how it was drawn (for the CLI to say)."""
    suffix = out.suffix.lower()
    if suffix == ".dot":
        out.write_text(to_dot(graph))
        return "DOT text"
    if suffix == ".svg":
        out.write_text(to_svg(graph))
    elif suffix == ".html":
        out.write_text(to_html(graph))
    else:
        raise ValueError(f"{out}: unknown picture format '{suffix}' (use .svg, .dot or .html)")
    return "Graphviz dot" if shutil.which("dot") else "the built-in layout (install graphviz for dot's)"


def _edge_labels(graph: Graph) -> dict[tuple[str, str], list[str]]:
    labels: dict[tuple[str, str], list[str]] = {}
    for e in graph.edges():
        labels.setdefault((e.src, e.dst), []).append(e.dst_port)
    return labels


def _esc(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _strip_xml_prolog(svg: str) -> str:
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


# -- fallback drawing: one row per topological generation --------------------------------

_W, _H, _GAP_X, _GAP_Y = 170, 54, 40, 70


def _layered_svg(graph: Graph) -> str:
    import networkx as nx

    layers = [sorted(layer) for layer in nx.topological_generations(graph.to_networkx())]
    width = max(len(layer) for layer in layers) * (_W + _GAP_X) + _GAP_X + 160
    height = len(layers) * (_H + _GAP_Y) + _GAP_Y
    pos: dict[str, tuple[float, float]] = {}
    for row, layer in enumerate(layers):
        offset = (width - 160 - len(layer) * (_W + _GAP_X) + _GAP_X) / 2
        for col, name in enumerate(layer):
            pos[name] = (offset + col * (_W + _GAP_X), _GAP_Y / 2 + row * (_H + _GAP_Y))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica" font-size="12">',
        '<defs><marker id="arrow" markerWidth="10" markerHeight="8" refX="9" refY="4" orient="auto">'
        '<path d="M0,0 L10,4 L0,8 z" fill="#333"/></marker></defs>',
    ]
    for (src, dst), ports in _edge_labels(graph).items():
        (x1, y1), (x2, y2) = pos[src], pos[dst]
        a = (x1 + _W / 2, y1 + _H)
        b = (x2 + _W / 2, y2)
        parts.append(f'<line x1="{a[0]:.0f}" y1="{a[1]:.0f}" x2="{b[0]:.0f}" y2="{b[1]:.0f}" '
                     'stroke="#333" marker-end="url(#arrow)"><title>data</title></line>')
        parts.append(f'<text x="{(a[0] + b[0]) / 2 + 6:.0f}" y="{(a[1] + b[1]) / 2:.0f}" fill="#333">'
                     f"{html.escape(', '.join(ports))}</text>")
    for c in graph.control_edges():
        (x1, y1), (x2, y2) = pos[c.src], pos[c.dst]
        right = width - 120
        path = (f"M{x1 + _W:.0f},{y1 + _H / 2:.0f} C{right:.0f},{y1:.0f} "
                f"{right:.0f},{y2 + _H:.0f} {x2 + _W:.0f},{y2 + _H / 2:.0f}")
        parts.append(f'<path d="{path}" fill="none" stroke="#c0392b" stroke-dasharray="6,4" '
                     'marker-end="url(#arrow)"><title>weights</title></path>')
        parts.append(f'<text x="{right - 10:.0f}" y="{(y1 + y2) / 2 + _H / 2:.0f}" fill="#c0392b">weights</text>')
    for name, (x, y) in pos.items():
        n = graph.nodes[name]
        fill = KIND_STYLE[n.kind][0]
        pool = f" ×{n.pool}" if n.pool else ""
        rx = 18 if n.kind in ("source", "custom") else 4
        parts.append(f'<g class="node"><rect x="{x:.0f}" y="{y:.0f}" width="{_W}" height="{_H}" rx="{rx}" '
                     f'fill="{fill}" stroke="#555"/>')
        parts.append(f'<text x="{x + _W / 2:.0f}" y="{y + 22:.0f}" text-anchor="middle" font-weight="bold">'
                     f"{html.escape(name)}</text>")
        parts.append(f'<text x="{x + _W / 2:.0f}" y="{y + 40:.0f}" text-anchor="middle">'
                     f"({n.kind}){pool}</text></g>")
    parts.append("</svg>")
    return "\n".join(parts) + "\n"

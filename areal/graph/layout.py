"""The built-in SVG layout of a `Picture`: what `areal viz` draws where Graphviz's `dot` is absent.

Clusters go in layers by the longest data path into them, so a join sits below all of its
inputs and the branches of one fan-out sit side by side in one layer; a layer's clusters are
ordered by where their inputs come from. A cluster's boxes stack in run order. An arrow between
neighbouring layers is an S-curve through the gap between them; one that skips layers runs down
a lane left of every cluster it passes, and weights run up lanes on the right, so no arrow
crosses a cluster it does not touch. A label goes where it hits no cluster and no other label,
sliding along its arrow when the first place is taken. Text widths are estimated (no font
metrics here) on the wide side, and bold text inside a shape is also fitted to it (`textLength`),
so no renderer's font spills it out; crossings are reduced only by that ordering.
"""

from __future__ import annotations

import html
import textwrap
from dataclasses import dataclass

from areal.graph.picture import Arrow, Cluster, Picture
from areal.graph.text_width import CHAR_W, fitted, text_width

BOX_W, BOX_H = 170, 50
PAD, HEADER = 12, 22  # inside a pool's frame: padding, and its caption's line
STACK_GAP = 40  # between the boxes of one pool
LAYER_GAP_MIN, CLUSTER_GAP = 56, 56
LANE_OFFSET, LANE_GAP = 30, 24
LINE_H, PILL_H = 14, 18  # 12 px text: line height; a pill's height

KIND_FILL = {
    "source": "#e8f1fb", "generate": "#e6f6ea", "reward": "#fff4dd",
    "compute-logprob": "#f3e9fb", "ppo-update": "#fde8e8", "custom": "#f2f2f2",
}
INK = {"data": "#333333", "channel": "#333333", "gate": "#1f6fb2", "weights": "#c0392b"}
PILL_FILL = {"gate": "#e8f1fb", "weights": "#fdeeee"}

Rect = tuple[float, float, float, float]  # x0, y0, x1, y1


@dataclass
class _Frame:
    """A cluster placed: `x` is the centre of its column of boxes, `y` its top."""

    cluster: Cluster
    left: float
    right: float
    height: float
    layer: int = 0
    x: float = 0.0
    y: float = 0.0

    @property
    def x0(self) -> float:
        return self.x - self.left

    @property
    def x1(self) -> float:
        return self.x + self.right

    @property
    def rect(self) -> Rect:
        return (self.x0, self.y, self.x1, self.y + self.height)

    def box_top(self, index: int) -> float:
        inset = HEADER + PAD if self.cluster.framed else 0
        return self.y + inset + index * (BOX_H + STACK_GAP)


@dataclass
class _Route:
    """An arrow's path, the thin rectangles along it (no label may cover them), and where its label may go:
    (x, y, anchor) spots in order of preference, the label growing right of x ("start") or left ("end")."""

    arrow: Arrow
    path: str
    trace: list[Rect]
    spots: list[tuple[float, float, str]]
    home: str = ""  # the frame an arrow inside one pool is drawn in (its label may sit in it)


def layered_svg(pic: Picture, heading: bool = True) -> str:
    """`heading`: a title and the staleness summary above the drawing (a page that has its own leaves it out)."""
    frames = {c.name: _frame(c, pic) for c in pic.clusters}
    cluster_of = {box: c.name for c in pic.clusters for box in c.boxes}
    links = [(cluster_of[a.src], cluster_of[a.dst], a) for a in pic.arrows if a.kind != "weights"
             and cluster_of[a.src] != cluster_of[a.dst]]
    _place(pic, frames, links)
    routes = _between_layers(frames, links) + _inside(pic, frames, cluster_of) + _weights(pic, frames, cluster_of)
    boxes = [(f.x - BOX_W / 2, f.box_top(i), f.x + BOX_W / 2, f.box_top(i) + BOX_H)
             for f in frames.values() for i in range(len(f.cluster.boxes))]
    extent = [f.rect for f in frames.values()] + [r for route in routes for r in route.trace]
    placed: list[Rect] = []
    labels = []
    for route in routes:
        blocked = boxes + placed + [f.rect for f in frames.values() if f.cluster.name != route.home]
        blocked += [r for other in routes if other is not route for r in other.trace]
        svg, rect = _label(route, blocked)
        labels.append(svg)
        placed.append(rect)
    body = [_cluster_svg(f, pic) for f in frames.values()] + [_edge(r) for r in routes] + labels
    return _document(pic, extent + placed, body, heading)


# -- sizes and places ----------------------------------------------------------------------------


def _frame(c: Cluster, pic: Picture) -> _Frame:
    n = len(c.boxes)
    pad = PAD if c.framed else 0
    left = right = BOX_W / 2 + pad
    inside = [a for a in pic.arrows if a.src in c.boxes and a.dst in c.boxes]
    for a in inside:
        w = _block_width(a)
        if a.kind == "weights":
            right = max(right, BOX_W / 2 + 30 + w + pad)
        elif abs(c.boxes.index(a.dst) - c.boxes.index(a.src)) == 1:
            right = max(right, 10 + w + pad)
        else:
            left = max(left, BOX_W / 2 + 30 + w + pad)
    if c.framed:
        right = max(right, text_width(_caption(c), bold=True) + 2 * PAD - left)
    height = (HEADER + 2 * PAD if c.framed else 0) + n * BOX_H + (n - 1) * STACK_GAP
    return _Frame(c, left, right, height)


def _place(pic: Picture, frames: dict[str, _Frame], links: list[tuple[str, str, Arrow]]) -> None:
    """Layers by the longest path in; each layer ordered by its inputs' places and centred on x = 0."""
    order = [c.name for c in pic.clusters]
    preds: dict[str, set[str]] = {name: set() for name in order}
    for src, dst, _ in links:
        preds[dst].add(src)
    for name in order:  # clusters come in data order: every producer before its consumers
        frames[name].layer = max((frames[p].layer + 1 for p in preds[name]), default=0)
    layers: list[list[str]] = [[] for _ in range(max((f.layer for f in frames.values()), default=0) + 1)]
    for name in order:
        layers[frames[name].layer].append(name)
    y = 0.0
    for k, layer in enumerate(layers):
        def pull(name: str) -> float:
            return sum(frames[p].x for p in preds[name]) / len(preds[name]) if preds[name] else 0.0

        layer.sort(key=lambda name: (pull(name), order.index(name)))
        width = sum(frames[n].left + frames[n].right for n in layer) + CLUSTER_GAP * (len(layer) - 1)
        x = -width / 2
        for name in layer:
            frames[name].x, frames[name].y = x + frames[name].left, y
            x += frames[name].left + frames[name].right + CLUSTER_GAP
        below = [_block_height(a) for s, d, a in links if frames[s].layer == k and frames[d].layer == k + 1]
        room = max(below, default=0) + 30 + (sum(below) - max(below, default=0)) / 2  # several labels share a gap
        y += max(frames[n].height for n in layer) + max(LAYER_GAP_MIN, room)


# -- arrows ----------------------------------------------------------------------------------------


def _between_layers(frames: dict[str, _Frame], links: list[tuple[str, str, Arrow]]) -> list[_Route]:
    """Channels: an S-curve into the next layer, or down a lane on the left to a layer further on."""
    near = [(s, d, a) for s, d, a in links if frames[d].layer - frames[s].layer == 1]
    far = [(s, d, a) for s, d, a in links if frames[d].layer - frames[s].layer > 1]
    outs, ins = _spread(near, frames, end=0), _spread(near, frames, end=1)
    routes = []
    for i, (s, d, a) in enumerate(near):
        ends = (outs[i], frames[s].y + frames[s].height), (ins[i], frames[d].y)
        (x1, y1), (x2, y2) = ends
        mid = (y1 + y2) / 2
        curve = [(x1, y1), (x1, mid), (x2, mid), (x2, y2)]
        away = "end" if x2 < x1 - 4 else "start"  # the label's first choice: the side the curve leans to
        spots = [(bx + (8 if side == "start" else -8), by, side)
                 for t in (0.5, 0.35, 0.65, 0.2, 0.8, 0.1, 0.9) for side in (away, "start" if away == "end" else "end")
                 for bx, by in [_bezier(t, *curve)]]
        routes.append(_Route(a, f"M{x1:.1f},{y1:.1f} C{x1:.1f},{mid:.1f} {x2:.1f},{mid:.1f} {x2:.1f},{y2 - 2:.1f}",
                             _trace([_bezier(k / 16, *curve) for k in range(17)]), spots))
    lanes: list[tuple[int, int]] = []  # the layers each left lane runs beside
    entering: dict[str, int] = {}
    leaving: dict[str, int] = {}
    for s, d, a in far:
        src, dst = frames[s], frames[d]
        first, last = src.layer, dst.layer
        index = sum(1 for lo, hi in lanes if lo <= last and first <= hi)
        lanes.append((first, last))
        lx = min(f.x0 for f in frames.values() if first <= f.layer <= last) - LANE_OFFSET - LANE_GAP * index
        y1 = src.y + src.height - min(18.0, src.height * 0.3) - 10 * leaving.get(s, 0)
        y2 = dst.y + min(18.0, dst.height * 0.3) + 10 * entering.get(d, 0)
        leaving[s], entering[d] = leaving.get(s, 0) + 1, entering.get(d, 0) + 1
        path = (f"M{src.x0:.1f},{y1:.1f} H{lx + 10:.1f} Q{lx:.1f},{y1:.1f} {lx:.1f},{y1 + 10:.1f} "
                f"V{y2 - 10:.1f} Q{lx:.1f},{y2:.1f} {lx + 10:.1f},{y2:.1f} H{dst.x0 - 2:.1f}")
        spots = [(lx - 6, y1 + (y2 - y1) * t, "end") for t in _ALONG]
        routes.append(_Route(a, path, _trace([(src.x0, y1), (lx, y1), (lx, y2), (dst.x0, y2)]), spots))
    return routes


_ALONG = (0.5, 0.35, 0.65, 0.2, 0.8, 0.1, 0.9)  # where along a lane its label is tried, in order


def _spread(arrows: list[tuple[str, str, Arrow]], frames: dict[str, _Frame], end: int) -> list[float]:
    """The x where each arrow leaves its source (end 0) or enters its target (end 1): spread over the
    cluster's width, ordered by where the other end lies, so arrows of one cluster do not cross."""
    xs = [0.0] * len(arrows)
    by_frame: dict[str, list[int]] = {}
    for i, arrow in enumerate(arrows):
        by_frame.setdefault(arrow[end], []).append(i)
    for name, members in by_frame.items():
        f = frames[name]
        members.sort(key=lambda i: frames[arrows[i][1 - end]].x)
        step = min(44.0, (f.left + f.right - 40) / max(len(members) - 1, 1))
        for k, i in enumerate(members):
            xs[i] = f.x + (k - (len(members) - 1) / 2) * step
    return xs


def _inside(pic: Picture, frames: dict[str, _Frame], cluster_of: dict[str, str]) -> list[_Route]:
    """Arrows between boxes of one pool: data straight down (or round the left), weights round the right."""
    routes = []
    for a in pic.arrows:
        if cluster_of[a.src] != cluster_of[a.dst]:
            continue
        f = frames[cluster_of[a.src]]
        i, j = f.cluster.boxes.index(a.src), f.cluster.boxes.index(a.dst)
        y1, y2 = f.box_top(i) + BOX_H / 2, f.box_top(j) + BOX_H / 2
        if a.kind == "weights":  # from the lower box's right side up to the upper one's
            x = f.x + BOX_W / 2
            path = f"M{x:.1f},{y1:.1f} C{x + 32:.1f},{y1:.1f} {x + 32:.1f},{y2:.1f} {x + 2:.1f},{y2:.1f}"
            routes.append(_Route(a, path, _trace([(x, y1), (x + 24, y1), (x + 24, y2), (x, y2)]),
                                 [(x + 28, (y1 + y2) / 2, "start")], f.cluster.name))
        elif j == i + 1:
            y1, y2 = f.box_top(i) + BOX_H, f.box_top(j)
            routes.append(_Route(a, f"M{f.x:.1f},{y1:.1f} V{y2 - 2:.1f}", _trace([(f.x, y1), (f.x, y2)]),
                                 [(f.x + 8, (y1 + y2) / 2, "start")], f.cluster.name))
        else:  # a box further down reads one above its neighbour: round the left of the boxes between
            x = f.x - BOX_W / 2
            path = f"M{x:.1f},{y1:.1f} C{x - 32:.1f},{y1:.1f} {x - 32:.1f},{y2:.1f} {x - 2:.1f},{y2:.1f}"
            routes.append(_Route(a, path, _trace([(x, y1), (x - 24, y1), (x - 24, y2), (x, y2)]),
                                 [(x - 28, (y1 + y2) / 2, "end")], f.cluster.name))
    return routes


def _weights(pic: Picture, frames: dict[str, _Frame], cluster_of: dict[str, str]) -> list[_Route]:
    """Weights routes between pools: from the trainer's box along a lane right of everything between."""
    lanes: list[tuple[int, int]] = []
    leaving: dict[str, int] = {}
    routes = []
    for a in pic.arrows:
        if a.kind != "weights" or cluster_of[a.src] == cluster_of[a.dst]:
            continue
        src, dst = frames[cluster_of[a.src]], frames[cluster_of[a.dst]]
        first, last = sorted((src.layer, dst.layer))
        index = sum(1 for lo, hi in lanes if lo <= last and first <= hi)
        lanes.append((first, last))
        lx = max(f.x1 for f in frames.values() if first <= f.layer <= last) + LANE_OFFSET + LANE_GAP * index
        x1 = src.x + BOX_W / 2
        y1 = src.box_top(src.cluster.boxes.index(a.src)) + BOX_H / 2 + 9 * leaving.get(a.src, 0)
        leaving[a.src] = leaving.get(a.src, 0) + 1
        x2 = dst.x + BOX_W / 2
        y2 = dst.box_top(dst.cluster.boxes.index(a.dst)) + BOX_H / 2
        r = 10 if y2 < y1 else -10  # the rounded corners turn up, or down
        path = (f"M{x1:.1f},{y1:.1f} H{lx - 10:.1f} Q{lx:.1f},{y1:.1f} {lx:.1f},{y1 - r:.1f} "
                f"V{y2 + r:.1f} Q{lx:.1f},{y2:.1f} {lx - 10:.1f},{y2:.1f} H{x2 + 2:.1f}")
        spots = [(lx + 6, y1 + (y2 - y1) * t, "start") for t in _ALONG]
        routes.append(_Route(a, path, _trace([(x1, y1), (lx, y1), (lx, y2), (x2, y2)]), spots))
    return routes


def _trace(points: list[tuple[float, float]]) -> list[Rect]:
    """Thin rectangles along a polyline: what a label must not cover."""
    return [(min(xa, xb) - 2, min(ya, yb) - 2, max(xa, xb) + 2, max(ya, yb) + 2)
            for (xa, ya), (xb, yb) in zip(points, points[1:])]


# -- drawing ---------------------------------------------------------------------------------------


def _ink(a: Arrow) -> str:
    return "weights" if a.kind == "weights" else "gate" if a.bound else a.kind


def _edge(route: _Route) -> str:
    a, ink = route.arrow, _ink(route.arrow)
    dash = ' stroke-dasharray="7,4"' if ink == "weights" else ""
    width = 2 if ink == "gate" else 1.3
    kind = "channel gated" if ink == "gate" else a.kind
    return (f'<g class="edge {kind}" id="{html.escape(a.key)}">'
            f"<title>{html.escape(a.src)} → {html.escape(a.dst)}: {html.escape(' '.join(a.label))}"
            f"{html.escape(' · ' + a.bound if a.bound else '')}</title>"
            f'<path d="{route.path}" fill="none" stroke="{INK[ink]}" stroke-width="{width}"{dash} '
            f'marker-end="url(#arrow-{ink})"/></g>')


def _label(route: _Route, blocked: list[Rect]) -> tuple[str, Rect]:
    """The arrow's label at its first spot that covers nothing in `blocked` (else the one that covers least)."""
    a = route.arrow
    w, h = _block_width(a), _block_height(a)

    def rect_at(x: float, y: float, anchor: str) -> Rect:
        return (x - w if anchor == "end" else x, y - h / 2, x if anchor == "end" else x + w, y + h / 2)

    def covered(spot: tuple[float, float, str]) -> float:
        return sum(_overlap_area(rect_at(*spot), other) for other in blocked)

    x, y, anchor = min(route.spots, key=covered)  # min keeps the first of equals: the preferred spot
    rect = rect_at(x, y, anchor)
    ink = _ink(a)
    colour = INK["weights" if a.kind == "weights" else "data"]
    parts = [f'<text x="{x:.1f}" y="{rect[1] + LINE_H * (k + 1) - 3:.1f}" text-anchor="{anchor}" '
             f'fill="{colour}">{html.escape(line)}</text>' for k, line in enumerate(a.label)]
    if a.bound:
        pw = text_width(a.bound, bold=True) + 12
        px = x - pw if anchor == "end" else x
        py = rect[1] + LINE_H * len(a.label) + 2
        parts.append(f'<rect class="bound" x="{px:.1f}" y="{py:.1f}" width="{pw:.1f}" height="{PILL_H - 3}" rx="8" '
                     f'fill="{PILL_FILL[ink]}" stroke="{INK[ink]}"/>')
        parts.append(f'<text class="bound" x="{px + 6:.1f}" y="{py + PILL_H - 8:.1f}" font-weight="bold" '
                     f'fill="{INK[ink]}"{fitted(a.bound, pw - 12)}>{html.escape(a.bound)}</text>')
    return '<g class="label">' + "".join(parts) + "</g>", rect


def _cluster_svg(f: _Frame, pic: Picture) -> str:
    c = f.cluster
    parts = [f'<g class="{"pool" if c.framed else "cell"}" id="pool-{html.escape(c.name)}">']
    if c.framed:
        parts.append(f'<rect x="{f.x0:.1f}" y="{f.y:.1f}" width="{f.left + f.right:.1f}" height="{f.height:.1f}" '
                     'rx="10" fill="#f7f8fa" stroke="#8a94a6" stroke-width="1.2"/>')
        parts.append(f'<text x="{f.x0 + PAD:.1f}" y="{f.y + PAD + 8:.1f}" font-weight="bold" fill="#44506a"'
                     f'{fitted(_caption(c), f.left + f.right - 2 * PAD)}>{html.escape(_caption(c))}</text>')
    for i, name in enumerate(c.boxes):
        box = pic.boxes[name]
        x, y = f.x - BOX_W / 2, f.box_top(i)
        rx = 18 if box.kind in ("source", "custom") else 4
        # a frozen model's box is dashed: a second model, loaded once, that no trainer moves
        outline = 'stroke="#555" stroke-width="2" stroke-dasharray="6,3"' if box.frozen else 'stroke="#555"'
        parts.append(f'<g class="node{" frozen" if box.frozen else ""}" id="node-{html.escape(name)}">'
                     f'<rect x="{x:.1f}" y="{y:.1f}" width="{BOX_W}" '
                     f'height="{BOX_H}" rx="{rx}" fill="{KIND_FILL.get(box.kind, "#f2f2f2")}" {outline}/>'
                     f'<text x="{f.x:.1f}" y="{y + 21:.1f}" text-anchor="middle" font-weight="bold"'
                     f"{fitted(name, BOX_W - 12)}>{html.escape(name)}</text>"
                     f'<text x="{f.x:.1f}" y="{y + 38:.1f}" text-anchor="middle"'
                     f'{fitted(box.caption, BOX_W - 12, bold=False)}>{html.escape(box.caption)}</text></g>')
    parts.append("</g>")
    return "".join(parts)


def _caption(c: Cluster) -> str:
    return f"{c.name} · {c.caption}" if c.caption else c.name


def _document(pic: Picture, extent: list[Rect], body: list[str], heading: bool) -> str:
    x0 = min(r[0] for r in extent) - 16
    x1 = max(r[2] for r in extent) + 16
    y0 = min(r[1] for r in extent) - 16
    y1 = max(r[3] for r in extent) + 16
    lines = []
    if heading:
        framed = any(c.framed for c in pic.clusters)
        lines = [f"graph {pic.title}" + (" as it runs: one frame per pool (a process per replica)" if framed else "")]
        lines += textwrap.wrap(pic.summary, max(60, int((x1 - x0) / CHAR_W)))
        y0 -= LINE_H * len(lines) + 6
        x1 = max(x1, x0 + max(text_width(line) for line in lines) + 16)
    head = "".join(f'<text x="{x0 + 8:.1f}" y="{y0 + LINE_H * (k + 1):.1f}" fill="#44506a" '
                   f'font-weight="{"bold" if k == 0 else "normal"}">{html.escape(line)}</text>'
                   for k, line in enumerate(lines))
    markers = "".join(
        f'<marker id="arrow-{ink}" markerWidth="10" markerHeight="8" refX="9" refY="4" orient="auto" '
        f'markerUnits="userSpaceOnUse"><path d="M0,0 L10,4 L0,8 z" fill="{colour}"/></marker>'
        for ink, colour in INK.items())
    w, h = x1 - x0, y1 - y0
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0f}" height="{h:.0f}" '
            f'viewBox="{x0:.1f} {y0:.1f} {w:.1f} {h:.1f}" font-family="Helvetica, Arial, sans-serif" '
            f'font-size="12">\n<title>graph {html.escape(pic.title)}</title>\n<defs>{markers}</defs>\n'
            f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{w:.1f}" height="{h:.1f}" fill="white"/>\n{head}\n'
            + "\n".join(body) + "\n</svg>\n")


# -- geometry --------------------------------------------------------------------------------------


def _block_width(a: Arrow) -> float:
    widths = [text_width(line) for line in a.label]
    if a.bound:
        widths.append(text_width(a.bound, bold=True) + 12)
    return max(widths, default=0.0)


def _block_height(a: Arrow) -> float:
    return LINE_H * len(a.label) + (PILL_H + 2 if a.bound else 0)


def _overlap_area(a: Rect, b: Rect) -> float:
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))


def _bezier(t: float, *points: tuple[float, float]) -> tuple[float, float]:
    (x0, y0), (x1, y1), (x2, y2), (x3, y3) = points
    u = 1 - t
    return (u**3 * x0 + 3 * u * u * t * x1 + 3 * u * t * t * x2 + t**3 * x3,
            u**3 * y0 + 3 * u * u * t * y1 + 3 * u * t * t * y2 + t**3 * y3)

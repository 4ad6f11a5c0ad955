"""What a drawing shows, before any renderer lays it out: boxes, the clusters they sit in, arrows.

A picture is built from the declared graph alone (every node its own unframed cluster, one
arrow per data edge, the weights as dashed arrows) or, given a `PlanView`, from the graph as it
runs: one framed cluster per pool with its nodes in run order, one arrow per channel carrying
exactly the fields that cross it, and the weights routes labelled with their staleness bound.
The graph layer never imports the runtime (DESIGN.md's layers), so the runtime hands its plan
over as the plain data below, the asynchronous edges' labels (η and the mode) worded by it,
since it owns what they mean. DOT and the built-in SVG layout both render a `Picture`, so the
two never disagree on what is drawn.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal.graph.graph import Graph

FIELD_WRAP = 34  # characters per line of a channel's field list


@dataclass(frozen=True)
class PoolView:
    """A pool of the plan: its nodes in run order, and how it runs ("stream ×2", "map, joins 2 inputs")."""

    name: str
    nodes: tuple[str, ...]
    caption: str


@dataclass(frozen=True)
class ChannelView:
    """Data from pool `src` to pool `dst`; `bound` names the staleness gate it waits on ("" for none)."""

    src: str
    dst: str
    fields: tuple[str, ...]  # qualified: "rollout.output_ids"
    bound: str = ""


@dataclass(frozen=True)
class RouteView:
    """New weights from trainer node `src` to node `dst`, at most as old as `bound` says."""

    src: str
    dst: str
    bound: str


@dataclass(frozen=True)
class PlanView:
    """The compiled plan as plain data for drawing (built by the runtime from its `Plan`)."""

    pools: tuple[PoolView, ...]  # the source's first, then in data order
    channels: tuple[ChannelView, ...]
    routes: tuple[RouteView, ...]
    summary: str  # one line on η and the mode, for a legend


@dataclass(frozen=True)
class Box:
    name: str
    kind: str
    caption: str  # "(generate)", "(generate) ×2" when the declared graph asks for replicas
    frozen: bool = False  # a model of its own that never trains (a KL reference): drawn apart


def _box(node: Any, replicas: bool) -> Box:
    """A node's box: its kind, or for a frozen model what that model is (a fixed copy, or another one)."""
    frozen = node.spec.params.get("frozen") if node.kind == "compute-logprob" else None
    if frozen:
        which = "the policy" if frozen is True else Path(str(frozen)).name or str(frozen)
        caption = f"(frozen: {which})"
        return Box(node.name, node.kind, caption if len(caption) <= 24 else "(frozen: another model)", frozen=True)
    return Box(node.name, node.kind, f"({node.kind})" + (f" ×{node.pool}" if replicas and node.pool else ""))


@dataclass(frozen=True)
class Cluster:
    name: str
    caption: str
    boxes: tuple[str, ...]  # in run order, stacked top to bottom
    framed: bool  # a pool is framed; a node of the declared graph alone is not


@dataclass(frozen=True)
class Arrow:
    src: str  # box
    dst: str  # box
    label: tuple[str, ...]  # lines
    kind: str  # "data" (port to port), "channel" (pool to pool) or "weights" (a control edge)
    bound: str = ""  # the staleness bound of an asynchronous edge, drawn apart so it stands out
    key: str = ""  # a stable id for the drawn edge: "channel:rollout:actor" (pools), "weights:actor:rollout"


@dataclass(frozen=True)
class Picture:
    title: str
    boxes: dict[str, Box]
    clusters: tuple[Cluster, ...]  # in data order
    arrows: tuple[Arrow, ...]
    summary: str = ""

    def cluster_of(self, box: str) -> Cluster:
        return next(c for c in self.clusters if box in c.boxes)


def picture(graph: Graph, view: PlanView | None = None) -> Picture:
    """The declared graph's picture, or with `view` the picture of what runs."""
    return _declared(graph) if view is None else _running(graph, view)


def _declared(graph: Graph) -> Picture:
    order = graph.topological()
    boxes = {n.name: _box(n, replicas=True) for n in order}
    arrows = [Arrow(src, dst, (", ".join(ports),), "data", key=f"data:{src}:{dst}")
              for (src, dst), ports in _port_labels(graph).items()]
    arrows += [Arrow(c.src, c.dst, ("weights",), "weights", key=f"weights:{c.src}:{c.dst}")
               for c in graph.control_edges()]
    clusters = tuple(Cluster(n.name, "", (n.name,), framed=False) for n in order)
    return Picture(graph.name, boxes, clusters, tuple(arrows))


def _running(graph: Graph, view: PlanView) -> Picture:
    boxes = {n.name: _box(n, replicas=False) for n in graph.topological()}
    clusters = tuple(Cluster(p.name, p.caption, p.nodes, framed=True) for p in view.pools)
    pool_of = {box: c.name for c in clusters for box in c.boxes}
    members = {c.name: c.boxes for c in clusters}
    arrows = [Arrow(src, dst, (", ".join(ports),), "data", key=f"data:{src}:{dst}")
              for (src, dst), ports in _port_labels(graph).items() if pool_of[src] == pool_of[dst]]
    # a batch leaves a pool after its last node and enters the next at its first
    arrows += [Arrow(members[c.src][-1], members[c.dst][0], field_lines(c.fields), "channel", c.bound,
                     key=f"channel:{c.src}:{c.dst}") for c in view.channels]
    arrows += [Arrow(r.src, r.dst, ("weights",), "weights", r.bound, key=f"weights:{r.src}:{r.dst}")
               for r in view.routes]
    return Picture(graph.name, boxes, clusters, tuple(arrows), view.summary)


def field_lines(fields: tuple[str, ...]) -> tuple[str, ...]:
    """Qualified fields grouped by producer ("rollout: output_ids, versions"), wrapped for a label."""
    by_producer: dict[str, list[str]] = {}
    for qualified in fields:
        producer, _, port = qualified.rpartition(".")
        by_producer.setdefault(producer, []).append(port)
    lines: list[str] = []
    for producer, ports in by_producer.items():
        text = f"{producer}: {', '.join(ports)}" if producer else ", ".join(ports)
        lines += textwrap.wrap(text, FIELD_WRAP, subsequent_indent="  ")
    return tuple(lines) or ("(ids only)",)


def _port_labels(graph: Graph) -> dict[tuple[str, str], list[str]]:
    labels: dict[tuple[str, str], list[str]] = {}
    for e in graph.edges():
        labels.setdefault((e.src, e.dst), []).append(e.dst_port)
    return labels

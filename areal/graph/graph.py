"""The graph a recipe declares: named nodes, and the edges their port names imply.

Edges are derived: an input port is fed by the one node whose output port has the same
name, unless `take=` names the producer. Weights travel on control edges from each
`ppo-update` to the `generate`, `episode` and `compute-logprob` nodes of its model; they are kept
apart from data edges so the data graph stays acyclic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import networkx as nx

from areal.errors import GraphError
from areal.graph.node import IMPLICIT_INPUTS, POLICY_KINDS, Location, Node, NodeSpec, caller_location, returns
from areal.graph.ports import Json, PortType
from areal.graph.task_list import TaskList
from areal.graph.validate import problems


@dataclass(frozen=True)
class Edge:
    """Data flows from `src.src_port` to `dst.dst_port`."""

    src: str
    src_port: str
    dst: str
    dst_port: str
    type: PortType


@dataclass(frozen=True)
class ControlEdge:
    """New weights flow from the trainer `src` (a ppo-update) to `dst`."""

    src: str
    dst: str


class Graph:
    """A dataflow graph under construction; `validate()` checks it whole."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.where = caller_location()
        self.nodes: dict[str, Node] = {}
        self._duplicates: list[tuple[str, Location | None]] = []
        self.heldout: dict[str, Any] = {}  # source name -> held-out tasks for pass@1

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, nodes={list(self.nodes)})"

    def source(
        self, name: str, tasks: Any, *, outputs: Mapping[str, PortType] | None = None, heldout: Any = None
    ) -> Node:
        """Add a replayable task stream: a source object, or a list of task dicts (areal/graph/task_list.py).

        Its ports come from `outputs`, else `tasks.ports`, else `tasks.fields` (names of json
        fields). `heldout` is a task collection the runtime scores pass@1 on at intervals.
        """
        where = caller_location()
        if isinstance(tasks, (list, tuple)) and (tasks or outputs is None):  # (an empty one with ports: a test's)
            tasks = TaskList(tasks, name, where)
        if outputs is not None:
            ports = dict(outputs)
        elif getattr(tasks, "ports", None):
            ports = dict(tasks.ports)
        elif getattr(tasks, "fields", None):
            ports = {f: Json["S"] for f in tasks.fields}
        else:  # nothing downstream could read it: say so here, not as every input "produced by no node"
            raise GraphError([f"{where}: source '{name}' names no fields: give {type(tasks).__name__} a `fields` "
                              "attribute (the names of a task's fields), pass outputs={'prompt': Json['S'], ...}, "
                              "or pass a list of task dicts"])
        ports.update(IMPLICIT_INPUTS)
        if heldout is not None:
            self.heldout[name] = TaskList(heldout, f"{name}' held-out", where) if isinstance(heldout, (list, tuple)) \
                else heldout
        spec = NodeSpec("source", name, {}, ports, returns(tasks), {}, type(tasks).__name__)
        return self._place(spec, name, pool=1, take={}, where=where)

    def add(
        self,
        spec: NodeSpec,
        *,
        name: str | None = None,
        pool: int | None = None,
        take: Mapping[str, str] | None = None,
    ) -> Node:
        """Place a node. `pool` asks for that many replicas; `take` names producers explicitly.

        `take={"reward": "score"}` feeds input `reward` from node `score`'s port of the same
        name; `take={"reward": "score.raw"}` from its port `raw`.
        """
        if not isinstance(spec, NodeSpec):
            raise TypeError(
                f"Graph.add takes a node (from @node or areal.nodes), got {type(spec).__name__}; "
                "decorate the function with @node(inputs=..., outputs=...)"
            )
        return self._place(spec, name or spec.name, pool, dict(take or {}), caller_location())

    def _place(
        self, spec: NodeSpec, name: str, pool: int | None, take: dict[str, str], where: Location | None
    ) -> Node:
        placed = Node(spec, name, pool, where, take)
        if name in self.nodes:
            self._duplicates.append((name, where))
        else:
            self.nodes[name] = placed
        return placed

    # -- derived structure ---------------------------------------------------------------

    def producers(self, port: str) -> list[Node]:
        return [n for n in self.nodes.values() if port in n.outputs]

    def edges(self) -> list[Edge]:
        """Data edges of a graph that validates (ambiguous or missing inputs are skipped)."""
        found = []
        for dst in self.nodes.values():
            for port, ptype in dst.inputs.items():
                src = self.resolve(dst, port)
                if src is not None:
                    found.append(Edge(src[0].name, src[1], dst.name, port, ptype))
        return found

    def resolve(self, dst: Node, port: str) -> tuple[Node, str] | None:
        """The (producer, its port) feeding `dst.port`, or None when missing or ambiguous."""
        if port in dst.take:
            src_name, _, src_port = dst.take[port].partition(".")
            src = self.nodes.get(src_name)
            src_port = src_port or port
            return (src, src_port) if src is not None and src_port in src.outputs else None
        candidates = [n for n in self.producers(port) if n.name != dst.name]
        return (candidates[0], port) if len(candidates) == 1 else None

    def control_edges(self) -> list[ControlEdge]:
        """trainer -> every node that uses its model's weights (generate, compute-logprob, a map naming it)."""
        found = []
        for n in self.nodes.values():
            model = self.model_of(n)
            if model is not None and model != n.name:
                found.append(ControlEdge(model, n.name))
        return found

    def trainers(self) -> list[str]:
        return [n.name for n in self.nodes.values() if n.role == "trainer"]

    def model_of(self, n: Node, trainers: list[str] | None = None) -> str | None:
        """The trainer node whose weights `n` uses: `model=` when given, else for a generate, an episode or an
        unfrozen compute-logprob node the only trainer; None for a frozen model and for nodes that hold none."""
        trainers = trainers if trainers is not None else self.trainers()
        named = n.spec.params.get("model")
        if named:
            return named if named in trainers else None
        if n.kind in POLICY_KINDS and not n.spec.params.get("frozen"):
            return trainers[0] if len(trainers) == 1 else None
        return None

    def to_networkx(self) -> nx.DiGraph:
        g = nx.DiGraph()
        for n in self.nodes.values():
            g.add_node(n.name, kind=n.kind)
        for e in self.edges():
            if g.has_edge(e.src, e.dst):
                g.edges[e.src, e.dst]["ports"].append(e.dst_port)
            else:
                g.add_edge(e.src, e.dst, ports=[e.dst_port])
        return g

    def topological(self) -> list[Node]:
        """Nodes in data order (declaration order breaks ties)."""
        order = {name: i for i, name in enumerate(self.nodes)}
        names = nx.lexicographical_topological_sort(self.to_networkx(), key=order.__getitem__)
        return [self.nodes[name] for name in names]

    def validate(self) -> Graph:
        """Raise one GraphError listing every problem; return self when there is none."""
        found = problems(self, self._duplicates)
        if found:
            raise GraphError(found)
        return self

    def of_kind(self, *kinds: str) -> Iterable[Node]:
        return (n for n in self.nodes.values() if n.kind in kinds)

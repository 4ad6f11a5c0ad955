"""Graph validation: every problem at once, each naming the node, the port and the recipe line.

Checks, in the order a reader fixes them: duplicate names, ports a node kind requires,
inputs produced by nobody or by several nodes, type mismatches along edges, cycles, and
trainers that generate / compute-logprob nodes refer to.
"""

from __future__ import annotations

from typing import Protocol

import networkx as nx

from areal.graph.node import POLICY_KINDS, REQUIRED_PORTS, Location, Node
from areal.graph.roles import SAMPLING_ROLES, call_problems, missing_methods


class Graph(Protocol):
    """What validation reads of a graph (graph.py's `Graph`, which calls it)."""

    name: str
    nodes: dict[str, Node]

    def producers(self, port: str) -> list[Node]: ...

    def model_of(self, n: Node, trainers: list[str] | None = None) -> str | None: ...

    def to_networkx(self) -> nx.DiGraph: ...


def problems(graph: Graph, duplicates: list[tuple[str, Location | None]]) -> list[str]:
    found: list[str] = []
    for name, where in duplicates:
        first = graph.nodes[name]
        at = f"{where}: " if where else ""
        found.append(
            f"{at}node name '{name}' is already used by {first.describe()}; give one of them another name"
        )
    if not graph.nodes:
        found.append(f"graph '{graph.name}' has no nodes; add a source with g.source(...) and nodes with g.add(...)")
    if graph.nodes and not any(n.kind == "source" for n in graph.nodes.values()):
        found.append(f"graph '{graph.name}' has no source; add one with g.source(name, tasks)")
    for n in graph.nodes.values():
        found += _required_ports(n)
        found += _pool(n)
        for port in n.inputs:
            found += _input(graph, n, port)
    found += _cycles(graph)
    found += _models(graph)
    found += _roles(graph)
    return found


def _roles(graph: Graph) -> list[str]:
    """A custom node has the methods its role needs; one sampled policy per run."""
    out = []
    trainers = {n.name for n in graph.nodes.values() if n.role == "trainer"}
    for n in graph.nodes.values():
        target = n.spec.implementation
        if target is None:
            continue  # a built-in kind: its implementation is areal's own
        follows = n.spec.params.get("model") in trainers and n.role in ("map", "filter")
        out += [f"{n.describe()}: {problem}" for problem in call_problems(n.role, target)]
        missing = missing_methods(n.role, target, follows_weights=follows)
        if missing:
            needs = ", ".join(m if m.endswith(")") else m + "()" for m in missing)
            article = "an" if n.role[0] in "aeiou" else "a"
            out.append(f"{n.describe()}: {article} {n.role} node needs {needs} "
                       f"(graph/roles.py); {getattr(target, '__name__', target)} has none")
    policies = sorted({graph.model_of(n) or "?" for n in graph.nodes.values() if n.role in SAMPLING_ROLES})
    if len(policies) > 1:
        out.append(f"graph '{graph.name}': generators sample {len(policies)} policies ({', '.join(policies)}); "
                   "the runtime samples one policy model per run")
    return out


def _required_ports(n: Node) -> list[str]:
    needed_in, needed_out = REQUIRED_PORTS.get(n.kind, (frozenset(), frozenset()))
    out = []
    for port in sorted(needed_in - set(n.inputs)):
        out.append(f"{n.describe()}: a {n.kind} node needs input port '{port}'; declare it in inputs=")
    for port in sorted(needed_out - set(n.outputs)):
        out.append(f"{n.describe()}: a {n.kind} node needs output port '{port}'; declare it in outputs=")
    return out


def _pool(n: Node) -> list[str]:
    if n.pool is not None and (not isinstance(n.pool, int) or n.pool < 1):
        return [f"{n.describe()}: pool={n.pool!r} must be a positive number of replicas"]
    return []


def _input(graph: Graph, n: Node, port: str) -> list[str]:
    if port in n.take:
        src_name, _, src_port = n.take[port].partition(".")
        src_port = src_port or port
        src = graph.nodes.get(src_name)
        if src is None:
            known = ", ".join(graph.nodes)
            return [f"{n.describe()}: take={{'{port}': '{n.take[port]}'}} names no node (nodes: {known})"]
        if src_port not in src.outputs:
            return [
                f"{n.describe()}: take={{'{port}': '{n.take[port]}'}}: node '{src_name}' has no output "
                f"'{src_port}' (it outputs: {', '.join(src.outputs) or 'nothing'})"
            ]
        return _mismatch(src, src_port, n, port)
    producers = [p for p in graph.producers(port) if p.name != n.name]
    if not producers and port in n.spec.optional:
        return []
    if not producers:
        offered = "; ".join(
            f"{', '.join(p.outputs)} (from '{p.name}')" for p in graph.nodes.values() if p.outputs and p is not n
        )
        return [
            f"{n.describe()}: input port '{port}' is produced by no node\n"
            f"  the graph produces: {offered or 'nothing'}. "
            f"Add a node that outputs '{port}', or feed it from another port with take={{'{port}': 'node.port'}}"
        ]
    if len(producers) > 1:
        names = ", ".join(f"'{p.name}' ({p.where})" for p in producers)
        return [
            f"{n.describe()}: input port '{port}' is produced by {len(producers)} nodes: {names}; "
            f"pick one with take={{'{port}': '{producers[0].name}'}}"
        ]
    return _mismatch(producers[0], port, n, port)


def _mismatch(src: Node, src_port: str, dst: Node, dst_port: str) -> list[str]:
    have, want = src.outputs[src_port], dst.inputs[dst_port]
    if have == want:
        return []
    return [f"{dst.describe()}: '{src.name}'.{src_port} is {have}; '{dst.name}' expects {want} on '{dst_port}'"]


def _cycles(graph: Graph) -> list[str]:
    g = graph.to_networkx()
    out = []
    for cycle in nx.simple_cycles(g):
        path = " -> ".join([*cycle, cycle[0]])
        lines = ", ".join(str(graph.nodes[name].where or "?") for name in cycle)
        out.append(f"cycle: {path} ({lines}); data must flow one way (weights go back on control edges)")
        if len(out) >= 5:
            break
    return out


def _models(graph: Graph) -> list[str]:
    trainers = [n.name for n in graph.nodes.values() if n.role == "trainer"]
    out = []
    for n in graph.nodes.values():
        if n.kind not in POLICY_KINDS or n.spec.params.get("frozen"):
            continue
        named = n.spec.params.get("model")
        if named and named not in trainers:
            have = ", ".join(f"'{t}'" for t in trainers) or "none"
            out.append(f"{n.describe()}: model='{named}' is no ppo-update node (ppo-update nodes: {have})")
        elif not named and len(trainers) > 1:
            out.append(
                f"{n.describe()}: {len(trainers)} trainer nodes ({', '.join(trainers)}); "
                "say which model this node uses with model='...'"
            )
    return out

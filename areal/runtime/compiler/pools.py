"""Which nodes share a process: the compiler's pools (compile.py's docstring gives the rules), and the LoRA
trainers whose pool holds the run's reference too (their model with the adapters disabled).
"""

from __future__ import annotations

from areal.config import RunConfig
from areal.errors import GraphError
from areal.graph.graph import Graph
from areal.graph.node import Node
from areal.graph.roles import SAMPLING_ROLES
from areal.graph.settings import node_config

OWN_POOL_KINDS = ("generate", "reward")


def lora_trainers(graph: Graph, config: RunConfig) -> list[str]:
    """The trainers of LoRA adapters (trainer.lora.rank > 0 in their own config)."""
    return [n.name for n in graph.nodes.values() if n.role == "trainer" and node_config(config, n).trainer.lora.rank]


def node_pools(graph: Graph, order: list[Node], bindings: list[tuple[str, str, str]],
           lora_trainers: list[str]) -> dict[str, list[str]]:
    """Pool name -> its nodes in run order (see the module docstring for the rules)."""
    members: dict[str, list[str]] = {}
    pool_of: dict[str, str] = {}
    for n in order:
        trainer = graph.model_of(n) if n.kind == "compute-logprob" else None
        if n.kind == "compute-logprob" and n.spec.params.get("frozen") is True and len(lora_trainers) == 1:
            trainer = lora_trainers[0]  # the run's model is that trainer's with its adapters disabled
        producers = {f.partition(".")[0] for node, _, f in bindings if node == n.name and "." in f}
        producer_pools = {pool_of[p] for p in producers if graph.nodes[p].kind != "source"}
        inside = sorted(p for p in producer_pools if p in lora_trainers)  # it reads a LoRA trainer's reference
        if trainer is not None and not n.spec.params.get("frozen"):
            _only_read_by(graph, n, trainer)
            name = trainer  # π_prox runs in its trainer's process (the pool is named after the trainer)
        elif trainer is not None or inside:
            name = trainer or inside[0]  # the reference, and what reads it, run in the LoRA trainer's process
            if any(graph.nodes[m].role == "trainer" for m in members.get(name, [])):
                raise GraphError([f"{n.describe()}: it reads what runs inside trainer '{name}', so it runs there "
                                  "too, but after the update: only what feeds the update may read it"])
        elif n.kind == "source" or n.role in (*SAMPLING_ROLES, "trainer") or n.kind in OWN_POOL_KINDS \
                or n.pool is not None or n.spec.params.get("frozen") or len(producer_pools) != 1:
            name = n.name
        else:
            (name,) = producer_pools
            tip = members[name][-1]
            head = graph.nodes[members[name][0]]
            if tip not in producers or head.role == "trainer" or graph.nodes[tip].role == "trainer":
                name = n.name  # it branches off the middle of a chain, or would follow an update: its own pool
        members.setdefault(name, []).append(n.name)
        pool_of[n.name] = name
    return members


def _only_read_by(graph: Graph, n: Node, trainer: str) -> None:
    consumers = {e.dst for e in graph.edges() if e.src == n.name}
    if consumers - {trainer}:
        raise GraphError([
            f"{n.describe()}: it runs inside trainer '{trainer}' (colocated, to see its current weights), "
            f"so only '{trainer}' may read its outputs; read by: {', '.join(sorted(consumers))}"
        ])

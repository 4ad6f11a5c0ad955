"""Compile a validated graph and its config into a `Plan`.

The pools form a pipeline in data order. Rules, in the order they apply:
- the source runs inside the controller, behind the staleness gate;
- a generate, reward or ppo-update node starts a pool of its own;
- a compute-logprob node joins the pool of the ppo-update that owns its model, just before it
  (π_prox must come from the trainer's current weights, in the same process);
- a custom node joins the pool before it unless the recipe gives it `pool=`.
Batches carry every field produced so far, so each node finds its inputs however the pools fall.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from areal.config import RunConfig
from areal.errors import ConfigError, GraphError
from areal.graph.graph import Graph
from areal.graph.node import Node
from areal.graph.settings import node_config
from areal.runtime.channels import ipc_endpoint
from areal.runtime.plan import Plan, PoolSpec

OWN_POOL_KINDS = ("generate", "reward", "ppo-update")


def compile_plan(graph: Graph, config: RunConfig, *, recipe: str = "", overrides: tuple[str, ...] = (),
                 run_dir: str | os.PathLike[str] = "RUN_DIR") -> Plan:
    order = _pipeline_order(graph)
    groups: list[list[Node]] = []
    for n in order:
        if groups and n.kind == "ppo-update" and groups[-1][-1].kind == "compute-logprob":
            groups[-1].append(n)  # the proximal pass runs in the trainer's process
            continue
        starts_pool = (
            not groups
            or n.kind in OWN_POOL_KINDS
            or n.kind == "compute-logprob"
            or groups[-1][0].kind == "source"
            or (n.kind == "custom" and n.pool is not None)
        )
        if starts_pool:
            groups.append([n])
        else:
            groups[-1].append(n)
    run = Path(run_dir)
    pools = tuple(_pool(i, members, graph, config, run) for i, members in enumerate(groups))
    unknown = sorted(set(config.gpus) - {p.name for p in pools})
    if unknown:
        raise ConfigError(f"gpus: no pool named {', '.join(map(repr, unknown))}; "
                          f"the pools are {', '.join(p.name for p in pools[1:])}")
    placed = {n for p in pools if p.role not in ("source", "train") for n in p.nodes[:1]}
    unplaced = sorted(set(config.placement) - placed)
    if unplaced:
        raise ConfigError(f"placement: {', '.join(map(repr, unplaced))} starts no pool of its own, so its "
                          f"replicas cannot be set; placement takes: {', '.join(sorted(placed))} "
                          "(a trainer's are trainer.ranks)")
    route = tuple(
        (p.name, q.name)
        for p in pools
        if p.role == "train"
        for q in pools
        if any(graph.nodes[n].kind == "generate" for n in q.nodes)
    )
    return Plan(
        graph=graph.name,
        recipe=recipe,
        overrides=tuple(overrides),
        run_dir=str(run),
        pools=pools,
        control_endpoint=_control_endpoint(run, config),
        weights_route=route,
        weights_dir=str(run / "weights"),
        high_water_mark=config.transport.high_water_mark,
        max_frame_bytes=config.transport.max_frame_bytes,
        max_header_bytes=config.transport.max_header_bytes,
        colocated=tuple(p.nodes for p in pools if len(p.nodes) > 1),
        weights_rendezvous=f"127.0.0.1:{_free_port()}" if route and config.transport.weights == "broadcast" else "",
        secured=config.transport.kind == "tcp" or config.cluster.backend == "ray",
    )


def _pipeline_order(graph: Graph) -> list[Node]:
    """Topological order with each compute-logprob moved just before its trainer."""
    order = graph.topological()
    trainers = {n.name for n in order if n.kind == "ppo-update"}
    moved: dict[str, list[Node]] = {}
    kept = []
    for n in order:
        model = graph.model_of(n) if n.kind == "compute-logprob" else None
        if model in trainers:
            consumers = [e.dst for e in graph.edges() if e.src == n.name]
            if any(c != model for c in consumers):
                raise GraphError([
                    f"{n.describe()}: it runs inside trainer '{model}' (colocated, to see its current weights), "
                    f"so only '{model}' may read its outputs; read by: {', '.join(sorted(set(consumers)))}"
                ])
            moved.setdefault(model, []).append(n)
        else:
            kept.append(n)
    out = []
    for n in kept:
        out += moved.get(n.name, [])
        out.append(n)
    trainer_at = next((i for i, n in enumerate(out) if n.kind == "ppo-update"), len(out))
    after = out[trainer_at + 1:]
    if after:
        raise GraphError([
            f"{n.describe()}: would run after the trainer '{out[trainer_at].name}', and in this runtime nothing runs "
            f"after an update (it ends each step); declare it before '{out[trainer_at].name}'" for n in after
        ])
    return out


def _pool(index: int, members: list[Node], graph: Graph, config: RunConfig, run: Path) -> PoolSpec:
    head = members[0]
    kinds = tuple(n.kind for n in members)
    if head.kind == "source":
        role = "source"
    elif "ppo-update" in kinds:
        role = "train"
    elif head.kind == "generate":
        role = "stream"
    else:
        role = "map"
    trainer = next((node_config(config, n).trainer for n in members if n.kind == "ppo-update"), config.trainer)
    if role == "source":
        replicas = 1  # one source cursor
    elif role == "train":
        replicas = trainer.ranks  # the ranks of one data-parallel trainer (FSDP)
    else:
        replicas = config.placement.get(head.name) or head.pool or 1
    threads = {"train": trainer.threads, "stream": config.generation.threads}.get(role, 1)
    name = head.name if role != "train" else next(n.name for n in members if n.kind == "ppo-update")
    bound = {"source": 0, "train": 1}.get(role, replicas)  # a trainer's rank 0 receives for all its ranks
    endpoints = tuple(_endpoint(run, f"{name}-{r}", config) for r in range(bound))
    return PoolSpec(
        name=name,
        nodes=tuple(n.name for n in members),
        kinds=kinds,
        role=role,
        replicas=replicas,
        threads=threads,
        endpoints=endpoints,
        gather_groups=config.batch_size if role == "train" else 1,
        rendezvous=f"127.0.0.1:{_free_port()}" if role == "train" and replicas > 1 else "",
        gpus=config.gpus.get(name, _default_gpus(role, config)),
    )


def _default_gpus(role: str, config: RunConfig) -> int:
    """A vLLM generator needs a GPU; so does each trainer rank of a run that generates on GPUs."""
    on_gpus = config.generation.engine == "vllm"
    return int(on_gpus and role in ("stream", "train"))


def _endpoint(run: Path, name: str, config: RunConfig) -> str:
    """A data endpoint. Under Ray a worker may land on any node and start in any order, so it binds a
    free port there and tells the controller, which wires its neighbours to it (`tcp://HOST:*`)."""
    if config.cluster.backend == "ray":
        return f"tcp://{config.transport.host}:*"
    if config.transport.kind == "tcp":
        return f"tcp://{config.transport.host}:{_free_port()}"
    return ipc_endpoint(run / "sockets", name)


def _control_endpoint(run: Path, config: RunConfig) -> str:
    """The controller's endpoint, known before any worker starts: on this machine, reachable from the nodes."""
    if config.transport.host == "node":
        from areal.runtime.placement import import_ray

        return f"tcp://{import_ray().util.get_node_ip_address()}:{_free_port()}"
    if config.transport.kind == "tcp" or config.cluster.backend == "ray":
        return f"tcp://{config.transport.host}:{_free_port()}"
    return ipc_endpoint(run / "sockets", "control")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

"""Compile a validated graph and its config into a `Plan`: pools, the channels between them, bindings.

Pools, in data order:
- the source runs inside the controller, behind the staleness gate;
- a generate (stream) node, an episode node, a reward node, a trainer, a frozen compute-logprob and
  any node given `pool=` start a pool of their own; a generate or episode node's pool is a stream
  pool (the worker steps it and hands it weights between steps);
- a compute-logprob node of a trained model joins that trainer's pool, just before the update
  (π_prox must come from the trainer's current weights, in the same process); so does a frozen one
  (`frozen=True`) when the only LoRA trainer trains the run's model: it is that trainer's model with the
  adapters disabled, a reference that costs no second model; any node that reads what runs inside a
  trainer's pool joins it too (nothing leaves a trainer's pool);
- any other node joins the pool of its producers when they all live in one pool whose last node
  feeds it (a linear chain runs in one process); a node that joins branches, or that branches
  off the middle of a chain, starts its own, so independent branches run side by side.

Each node's input port is bound to one qualified field (`producer.port`, as the graph resolves
it, `take=` included); a channel from pool P to pool C carries every field C's nodes read from
P. A pool with several input channels joins them per group (runtime/worker/join.py). A side branch,
a pool no trainer reads from, sends every trainer its samples' ids all the same: the trainer waits
for its verdict on each group, so a sample it failed or filtered is not trained.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from areal.config import RunConfig
from areal.errors import ConfigError, GraphError
from areal.graph.graph import Graph
from areal.graph.node import IMPLICIT_INPUTS, Node
from areal.graph.roles import SAMPLING_ROLES
from areal.graph.settings import node_config
from areal.runtime.compiler.cluster import control_endpoint, endpoints, free_port, weights_transport
from areal.runtime.compiler.plan import Channel, Plan, PoolSpec
from areal.runtime.compiler.pools import lora_trainers, node_pools
from areal.runtime.staleness.policies import policy_named


def compile_plan(graph: Graph, config: RunConfig, *, recipe: str = "", overrides: tuple[str, ...] = (),
                 run_dir: str | os.PathLike[str] = "RUN_DIR") -> Plan:
    run = Path(run_dir)
    order = graph.topological()
    bindings = _bindings(graph, order)
    members = node_pools(graph, order, bindings, lora_trainers(graph, config))
    pool_of = {n: name for name, nodes in members.items() for n in nodes}
    reward_field = _reward_field(graph, config)
    solved_field = _named_output(graph, "eval.solved", config.eval.solved) if config.eval.solved else reward_field
    fields_in: dict[tuple[str, str], list[str]] = {}  # (src pool, dst pool) -> qualified fields
    for node_name, _, field in bindings:
        _route(fields_in, pool_of, field, pool_of[node_name])
    for name, nodes in members.items():
        if any(graph.nodes[n].role == "trainer" for n in nodes):
            # a trainer reports the reward of what it trained, and whether each sample was solved
            for reported in dict.fromkeys(f for f in (reward_field, solved_field) if f):
                _route(fields_in, pool_of, reported, name)
    generators = [n for n in order if n.role in SAMPLING_ROLES]
    policy = graph.model_of(generators[0]) or "" if generators else ""
    versions_field = _versions_field(graph, config, generators, policy, bindings)
    if versions_field:  # the policy's trainer checks η by them, whatever its node declares
        _route(fields_in, pool_of, versions_field, pool_of[policy])
    _check_inputs(graph, members, fields_in)
    trainers = {name for name, nodes in members.items() if graph.nodes[nodes[-1]].role == "trainer"}
    _route_verdicts(graph, members, fields_in, trainers)
    downstream = _downstream(members, fields_in)
    _check_filters(graph, members, downstream, trainers)
    levels = _levels(graph, members, fields_in)
    pools = [_pool(name, [graph.nodes[n] for n in nodes], graph, config, levels[name])
             for name, nodes in members.items()]
    by_name = {p.name: p for p in pools}
    inputs_count = {dst: sum(1 for _, d in fields_in if d == dst) for dst in members}
    channels = tuple(
        Channel(src, dst, tuple(sorted(set(fields))), endpoints(run, src, by_name[dst], config),
                "by_group" if inputs_count[dst] > 1 and by_name[dst].role != "train" and by_name[dst].replicas > 1
                else "balance")
        for (src, dst), fields in fields_in.items()
    )
    _check_names(config, pools)
    _check_truncated(graph, config)
    _check_kl_reference(graph, config)
    routes = tuple((pool_of[trainer], pool_of[n.name]) for n in order for trainer in [graph.model_of(n)]
                   if trainer is not None and pool_of[n.name] != pool_of[trainer])
    lora_rank = node_config(config, graph.nodes[policy]).trainer.lora.rank if policy in graph.nodes else 0
    episodes = [n for n in generators if n.role == "episode"]
    if config.staleness_policy == "recycle" and episodes:
        raise ConfigError(f"staleness_policy=recycle: {episodes[0].describe()} is an episode, which is not "
                          "interrupted mid-way, so it cannot be re-queued; staleness_policy=token masks the same "
                          "tokens without re-queueing")
    return Plan(
        graph=graph.name,
        recipe=recipe,
        overrides=tuple(overrides),
        run_dir=str(run),
        pools=tuple(pools),
        channels=channels,
        bindings=tuple(bindings),
        control_endpoint=control_endpoint(run, config),
        weights_routes=tuple(dict.fromkeys(routes)),
        weights_dir=str(run / "weights"),
        high_water_mark=config.transport.high_water_mark,
        max_frame_bytes=config.transport.max_frame_bytes,
        max_header_bytes=config.transport.max_header_bytes,
        policy=policy,
        versions_field=versions_field,
        reward_field=reward_field,
        solved_field=solved_field,
        solved_at=config.eval.solved_at,
        weights_rendezvous=f"127.0.0.1:{free_port()}" if policy and config.transport.weights == "broadcast" else "",
        weights_transport=weights_transport(config),
        secured=config.transport.kind == "tcp" or config.cluster.backend == "ray",
        colocated=tuple(p.nodes for p in pools if len(p.nodes) > 1),
        staleness=config.staleness,
        mode=config.mode,
        staleness_policy=config.staleness_policy,
        recycle_keep_prefix=config.recycle_keep_prefix,
        drop_slack=config.drop_slack,
        lora_rank=lora_rank,
    )


# -- bindings and pools ---------------------------------------------------------------------------


def _bindings(graph: Graph, order: list[Node]) -> list[tuple[str, str, str]]:
    """(node, input port, qualified field): the runtime names every field by its producer."""
    found = []
    for n in order:
        for port in n.inputs:
            resolved = graph.resolve(n, port)
            if port in IMPLICIT_INPUTS and (resolved is None or resolved[0].kind == "source"):
                found.append((n.name, port, port))  # the runtime's own: on every batch, at every level
            elif resolved is not None:
                found.append((n.name, port, f"{resolved[0].name}.{resolved[1]}"))
    return found


def _route(fields_in: dict[tuple[str, str], list[str]], pool_of: dict[str, str], field: str, dst: str) -> None:
    if "." not in field:
        return  # sample_id and group_id travel on every channel
    src = pool_of[field.partition(".")[0]]
    if src != dst:
        fields_in.setdefault((src, dst), []).append(field)


def _reward_field(graph: Graph, config: RunConfig) -> str:
    """The field reported as the run's reward: eval.reward, else the only port named 'reward'."""
    if config.eval.reward:
        return _named_output(graph, "eval.reward", config.eval.reward)
    producers = [n for n in graph.nodes.values() if "reward" in n.outputs]
    if len(producers) > 1:
        raise ConfigError(f"{len(producers)} nodes output 'reward' ({', '.join(n.name for n in producers)}): say "
                          f"which the run reports with --set eval.reward={producers[0].name}.reward")
    return f"{producers[0].name}.reward" if producers else ""


def _named_output(graph: Graph, setting: str, value: str) -> str:
    node_name, _, port = value.partition(".")
    n = graph.nodes.get(node_name)
    if n is None or port not in n.outputs:
        raise ConfigError(f"{setting}={value!r}: no node '{node_name}' with an output '{port}'")
    return value


def _check_inputs(graph: Graph, members: dict[str, list[str]], fields_in: dict[tuple[str, str], list[str]]) -> None:
    fed = {dst for _, dst in fields_in}
    for name, nodes in members.items():
        head = graph.nodes[nodes[0]]
        if head.kind != "source" and name not in fed:
            raise GraphError([f"{head.describe()}: it reads no field another node produces, so nothing tells the "
                              "runtime which samples to give it; give it an input port (a field it uses)"])


def _route_verdicts(graph: Graph, members: dict[str, list[str]], fields_in: dict[tuple[str, str], list[str]],
                    trainers: set[str]) -> None:
    """A side branch (a pool whose data no trainer reads) sends each trainer its samples' ids: the trainer's join
    then waits for its verdict, so a row it failed or filtered is never trained, as on the trainer's own path."""
    downstream = _downstream(members, fields_in)
    for name, nodes in members.items():
        if graph.nodes[nodes[0]].kind != "source" and name not in trainers and not downstream[name] & trainers:
            for trainer in sorted(trainers):
                fields_in[(name, trainer)] = []


def side_branch_notes(graph: Graph, plan: Plan) -> list[str]:
    """One line per side branch: what it outputs that no node reads, and that the trainer waits for its verdict.
    A misnamed port makes a branch dead silently, so an output close to a port some node reads is named."""
    read = {port for n in graph.nodes.values() for port in n.inputs}
    notes = []
    for src in sorted({c.src for c in plan.channels if not c.fields}):
        tip = graph.nodes[plan.pool(src).nodes[-1]]
        bound = {field for _, _, field in plan.bindings}
        unread = [port for port in tip.outputs if f"{tip.name}.{port}" not in bound]
        near = {port: close[0] for port in unread if (close := difflib.get_close_matches(port, read - {port}, 1))}
        hint = "".join(f"; did you mean '{near[p]}' for '{p}'?" for p in unread if p in near)
        notes.append(f"{tip.describe()}: a side branch: no node reads its output "
                     f"{', '.join(repr(p) for p in unread) or 'fields'}; the trainer waits for its verdict on each "
                     f"group, and a sample it fails is not trained{hint}")
    return notes


def _downstream(members: dict[str, list[str]], fields_in: dict[tuple[str, str], list[str]]) -> dict[str, set[str]]:
    """Pool -> every pool its data reaches."""
    downstream: dict[str, set[str]] = {name: set() for name in members}
    order = list(members)
    for src, dst in sorted(fields_in, key=lambda e: order.index(e[0]), reverse=True):
        downstream[src] |= {dst} | downstream[dst]
    return downstream


def _check_filters(graph: Graph, members: dict[str, list[str]], downstream: dict[str, set[str]],
                   trainers: set[str]) -> None:
    """A filter's drops must reach every trainer: a batch is B groups for all of them, or the gate cannot refill."""
    for name, nodes in members.items():
        for n in (graph.nodes[x] for x in nodes if graph.nodes[x].role == "filter"):
            missed = trainers - downstream[name] - {name}
            if missed:
                raise GraphError([f"{n.describe()}: a filter must come before every trainer, and "
                                  f"{', '.join(sorted(missed))} does not read what it passes"])


def _levels(graph: Graph, members: dict[str, list[str]], fields_in: dict[tuple[str, str], list[str]]) -> dict[str, str]:
    """'group' for the source and the pools fed only at group level (before generation), else 'sample'."""
    levels: dict[str, str] = {}
    for name, nodes in members.items():
        head = graph.nodes[nodes[0]]
        if head.kind == "source":
            levels[name] = "group"
        elif head.role in SAMPLING_ROLES:
            levels[name] = "sample"
        else:
            sources = [src for src, dst in fields_in if dst == name]
            levels[name] = "sample" if any(levels[s] == "sample" for s in sources) else "group"
    return levels


def _pool(name: str, members: list[Node], graph: Graph, config: RunConfig, level: str) -> PoolSpec:
    head = members[0]
    kinds = tuple(n.kind for n in members)
    trainer_node = next((n for n in members if n.role == "trainer"), None)
    if head.kind == "source":
        role = "source"
    elif trainer_node is not None:
        role = "train"
    elif head.role in SAMPLING_ROLES:
        role = "stream"
    else:
        role = "map"
    trainer = node_config(config, trainer_node).trainer if trainer_node is not None else config.trainer
    if role == "source":
        replicas = 1  # one source cursor
    elif role == "train":
        replicas = trainer.ranks  # the ranks of one data-parallel trainer (FSDP)
    else:
        replicas = config.placement.get(head.name) or head.pool or 1
    threads = {"train": trainer.threads, "stream": config.generation.threads}.get(role, 1)
    followed = next((m for n in members if (m := graph.model_of(n)) is not None), "")
    return PoolSpec(
        name=name,
        nodes=tuple(n.name for n in members),
        kinds=kinds,
        role=role,
        replicas=replicas,
        threads=threads,
        level=level,
        gather_groups=config.batch_size if role == "train" else 1,
        rendezvous=f"127.0.0.1:{free_port()}" if role == "train" and replicas > 1 else "",
        gpus=config.gpus.get(name, _default_gpus(role, config)),
        model=trainer_node.name if trainer_node is not None else followed,
    )


def _check_names(config: RunConfig, pools: list[PoolSpec]) -> None:
    for setting, named in (("gpus", config.gpus), ("cluster.resources", config.cluster.resources),
                           ("cluster.strategies", config.cluster.strategies)):
        unknown = sorted(set(named) - {p.name for p in pools})
        if unknown:
            raise ConfigError(f"{setting}: no pool named {', '.join(map(repr, unknown))}; "
                              f"the pools are {', '.join(p.name for p in pools[1:])}")
    placed = {p.name for p in pools if p.role not in ("source", "train")}
    unplaced = sorted(set(config.placement) - placed)
    if unplaced:
        raise ConfigError(f"placement: {', '.join(map(repr, unplaced))} starts no pool of its own, so its "
                          f"replicas cannot be set; placement takes: {', '.join(sorted(placed))} "
                          "(a trainer's are trainer.ranks)")


def _versions_field(graph: Graph, config: RunConfig, generators: list[Node], policy: str,
                    bindings: list[tuple[str, str, str]]) -> str:
    """The field whose per-token versions the policy's trainer checks η by and masks with: the one its `versions`
    port reads, or, when its node declares none, its generator's (a trainer of the researcher's own is held to the
    same bound). A policy that masks needs the trainer to read the mask: refused when its node has no `loss_mask`."""
    if not policy:
        return ""
    trainer = graph.nodes[policy]
    masks = policy_named(config.staleness_policy, config.recycle_keep_prefix).masks and config.mode != "sync"
    if masks and "loss_mask" not in trainer.inputs:
        raise ConfigError(f"staleness_policy={config.staleness_policy}: {trainer.describe()} has no `loss_mask` "
                          "input, so the tokens older than η this policy masks would still be trained; declare "
                          "`loss_mask: Float['S', 'T']` among its inputs (optional={'loss_mask'}) and weight its loss "
                          "by it (docs/trainer-nodes.md), or use staleness_policy=strict")
    declared = next((field for n, port, field in bindings if n == policy and port == "versions"), "")
    if declared:
        return declared
    sampling = [n for n in generators if graph.model_of(n) == policy]
    with_versions = [n for n in sampling if "versions" in n.outputs]
    if len(with_versions) != 1 or len(sampling) != 1:
        raise ConfigError(f"{trainer.describe()}: it has no `versions` input, and the runtime cannot tell which "
                          f"tokens' versions to check η by: {len(with_versions)} of its {len(sampling)} generators "
                          "output `versions`; declare a `versions: Int['S', 'T']` input (take= names its producer)")
    return f"{with_versions[0].name}.versions"


def _check_truncated(graph: Graph, config: RunConfig) -> None:
    """trainer.truncated=mask reads which outputs were cut: the trainer must take `truncated` from a node, and read
    the loss mask the cut outputs' zeros go into."""
    for n in graph.nodes.values():
        if n.role != "trainer" or node_config(config, n).trainer.truncated != "mask":
            continue
        if "truncated" not in n.inputs or "loss_mask" not in n.inputs:
            raise ConfigError(f"trainer.truncated=mask: {n.describe()} takes no `truncated` and `loss_mask` inputs, "
                              "so it cannot tell which outputs were cut, or leave them out of its loss")
        if graph.resolve(n, "truncated") is None:
            raise ConfigError(f"trainer.truncated=mask: no node outputs `truncated` for {n.describe()} (generate "
                              "nodes do; an episode does not cut its turns that way)")


def _check_kl_reference(graph: Graph, config: RunConfig) -> None:
    """trainer.kl_coef > 0 is a KL loss to a reference: the trainer must read `ref_logp` from a frozen node, not
    train without the term it was asked for, nor against its own policy (a KL of 0)."""
    for n in graph.nodes.values():
        if n.role != "trainer" or node_config(config, n).trainer.kl_coef == 0:
            continue
        how = ("add compute_logprob(\"reference\", frozen=True, output=\"ref_logp\") to the graph "
               "(docs/trainer-nodes.md), or set trainer.kl_coef=0")
        if "ref_logp" not in n.inputs:
            raise ConfigError(f"trainer.kl_coef: {n.describe()} takes no `ref_logp` input, so no reference to keep "
                              "its policy near; ppo_update takes one (optional), from a frozen compute_logprob")
        found = graph.resolve(n, "ref_logp")
        if found is None:
            raise ConfigError(f"trainer.kl_coef={node_config(config, n).trainer.kl_coef}: no node outputs `ref_logp` "
                              f"for {n.describe()}; {how}")
        producer = found[0]
        if producer.kind != "compute-logprob" or not producer.spec.params.get("frozen"):
            raise ConfigError(f"trainer.kl_coef: {n.describe()} reads `ref_logp` from {producer.describe()}, which is "
                              "no frozen reference (a KL to the policy being trained is 0); " + how)


def _default_gpus(role: str, config: RunConfig) -> int:
    """A vLLM generator needs a GPU; so does each trainer rank of a run that generates on GPUs."""
    on_gpus = config.generation.engine == "vllm"
    return int(on_gpus and role in ("stream", "train"))


# -- endpoints ----------------------------------------------------------------------------------------

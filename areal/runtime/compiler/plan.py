"""The compiled plan: which process runs which nodes, and which channels join them.

A `Plan` is plain data (frozen dataclasses of strings and ints), printable and serialisable to
JSON, so `plan.json` in the run directory is enough to read or repeat a run. It is the graph
as it runs: one pool per group of colocated nodes (a linear chain, or a trainer with its
proximal pass), and one `Channel` per pair of pools that a data edge crosses, carrying exactly
the fields the receiving pool's nodes read from the sending pool. A pool with several input
channels joins them by group; branches that do not depend on each other are separate pools and
run at the same time. Fields are named by their producer (`score.reward`), so two nodes may
produce ports of the same name and each consumer gets the one it asked for.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING

from rich.table import Table
from rich.tree import Tree

from areal.graph.picture import ChannelView, PlanView, PoolView, RouteView
from areal.runtime.staleness.policies import policy_named
from areal.runtime.staleness.policies.policy import versions

if TYPE_CHECKING:
    from areal.graph.graph import Graph

WIDE_TABLE_COLUMNS = 140  # narrower terminals get `Plan.tree`: the table's columns would each be cut
IMPLICIT = ("sample_id", "group_id")  # every batch carries them, on every channel
# how each transport.weights kind is shown in the plan (runtime/weights/ holds the transports themselves)
WEIGHTS_WAYS = {
    "files": "via {weights_dir}",
    "broadcast": "by process-group broadcast ({rendezvous})",
    "shm": "through a shared-memory segment per version, on the trainer's machine",
    "tcp": "fetched by each follower from the trainer over TCP, no disk",
    "auto": "via {weights_dir} on one node, over TCP to other nodes (decided as the workers land)",
}


@dataclass(frozen=True)
class Channel:
    """Data from every replica of pool `src` to pool `dst`: the fields `dst` reads from `src`."""

    src: str
    dst: str
    fields: tuple[str, ...]  # qualified ("rollout.output_ids"); sample_id and group_id travel too
    endpoints: tuple[str, ...]  # one per receiving replica (a trainer: its rank 0 only)
    # "balance": ZeroMQ deals batches to any replica; "by_group": the group picks the replica, so that
    # every input of a joining pool brings a group to the same one
    routing: str = "balance"


@dataclass(frozen=True)
class PoolSpec:
    name: str
    nodes: tuple[str, ...]  # run in this order inside one process, batch by batch
    kinds: tuple[str, ...]
    role: str  # "source" (in the controller), "stream" (a generate node first), "train" (a trainer), "map"
    replicas: int
    threads: int
    level: str = "sample"  # "group": one row per prompt (before generation); "sample": one per sample
    gather_groups: int = 1  # groups gathered before the pool's nodes run (B for a trainer)
    rendezvous: str = ""  # a trainer of several ranks: their torch.distributed rendezvous, host:port
    gpus: int = 0  # per replica: what Ray reserves for it (and makes the only GPUs it sees)
    model: str = ""  # a trainer pool: the model it trains; another pool: the model whose weights it follows

    def worker_ids(self) -> list[str]:
        return [f"{self.name}[{r}]" for r in range(self.replicas)]


@dataclass(frozen=True)
class Plan:
    graph: str
    recipe: str
    overrides: tuple[str, ...]
    run_dir: str
    pools: tuple[PoolSpec, ...]  # the source first, then in data order
    channels: tuple[Channel, ...]
    bindings: tuple[tuple[str, str, str], ...]  # (node, input port, qualified field it reads)
    control_endpoint: str
    weights_routes: tuple[tuple[str, str], ...]  # (trainer pool, pool that follows its model's weights)
    weights_dir: str
    high_water_mark: int
    max_frame_bytes: int
    max_header_bytes: int
    policy: str = ""  # the trainer whose model the generators sample ("" without generation)
    versions_field: str = ""  # the per-token versions the policy's trainer checks η by (its node's, or its generator's)
    reward_field: str = ""  # the qualified field reported as the run's reward (step metrics)
    solved_field: str = ""  # the field that says a sample is solved (held-out pass@1), from solved_at on
    solved_at: float = 1.0
    weights_rendezvous: str = ""  # transport.weights=broadcast: host:port of the weights group's store
    weights_transport: str = "files"  # transport.weights: how the policy's versions travel (others': files)
    secured: bool = False  # TCP sockets: every one is armed with the run's CURVE key (security.py)
    colocated: tuple[tuple[str, ...], ...] = field(default=())
    staleness: int = 0  # η, as configured (shown on the asynchronous edges; the controller reads the config)
    mode: str = "async"  # "async", "sync" (η = 0, no overlap) or "lagged" (sampled exactly η versions old)
    recipe_sha256: str = ""  # the recipe file's hash when the run started or resumed (an edit is refused on resume)
    staleness_policy: str = "strict"  # what η bounds beyond admission (runtime/policies)
    recycle_keep_prefix: bool = False  # staleness_policy=recycle: re-queued groups train their older tokens
    drop_slack: int = 0  # staleness_policy=drop: groups the gate admits past its bound
    home_run_dir: str = ""  # a worker's plan on a node without the run directory: the run directory it mirrors
    lora_rank: int = 0  # the policy's LoRA rank (its trainer's trainer.lora.rank): generators get adapters; 0: none

    # -- reading the plan ---------------------------------------------------------------

    def pool(self, name: str) -> PoolSpec:
        return next(p for p in self.pools if p.name == name)

    def pool_of(self, node: str) -> PoolSpec:
        return next(p for p in self.pools if node in p.nodes)

    def inputs_of(self, pool: str) -> list[Channel]:
        return [c for c in self.channels if c.dst == pool]

    def outputs_of(self, pool: str) -> list[Channel]:
        return [c for c in self.channels if c.src == pool]

    def trainer_pools(self) -> list[PoolSpec]:
        return [p for p in self.pools if p.role == "train"]

    def followers(self, trainer_pool: str) -> list[str]:
        """Pools that take this trainer's new weights (its generators and the maps that follow its model)."""
        return [dst for src, dst in self.weights_routes if src == trainer_pool]

    def binding(self, node: str) -> dict[str, str]:
        """Input port -> the qualified field node `node` reads on it."""
        return {port: qualified for n, port, qualified in self.bindings if n == node}

    def bound_endpoints(self) -> list[str]:
        """Every data endpoint some worker binds, and the controller's."""
        return [self.control_endpoint, *(e for c in self.channels for e in c.endpoints)]

    def sender_limits(self) -> dict[str, int]:
        """What every PUSH end of the run is built with: the queue depth and the receivers' frame limits."""
        return {"hwm": self.high_water_mark, "max_frame_bytes": self.max_frame_bytes,
                "max_header_bytes": self.max_header_bytes}

    def weights_members(self) -> dict[str, int]:
        """Worker id -> member of the weights group: 0 the policy trainer's rank 0, then each generator replica."""
        if not self.policy:
            return {}
        members = {f"{self.policy}[0]": 0}
        for pool in self.followers(self.policy):
            if self.pool(pool).role == "stream":
                for worker in self.pool(pool).worker_ids():
                    members[worker] = len(members)
        return members

    # -- the asynchronous edges ----------------------------------------------------------

    def gated(self) -> list[Channel]:
        """The channels the staleness gate holds back: the source's into generation (all of its own, without one)."""
        source = [c for c in self.channels if self.pool(c.src).role == "source"]
        into_generation = [c for c in source if self.pool(c.dst).role == "stream"]
        return into_generation or source

    def gate_bound(self) -> str:
        """The gate's label: how far generation may run ahead of the slowest trainer."""
        if self.mode == "async":
            policy = policy_named(self.staleness_policy, self.recycle_keep_prefix)
            extra = f" + {self.drop_slack} groups" if self.drop_slack else ""
            return (f"η={self.staleness} (async, {policy.name}): ≤ {versions(self.staleness)}{extra} ahead; "
                    f"{policy.bound_at(self.staleness)}")
        return f"η=0 ({self.mode}): waits for training"

    def weights_bound(self) -> str:
        """A weights route's label: how old the weights it delivers may be."""
        if self.mode == "async":
            return f"η={self.staleness} (async): ≤ {versions(self.staleness)} behind"
        if self.mode == "lagged":
            return f"η={self.staleness} (lagged): exactly {versions(self.staleness)} behind"
        return "η=0 (sync): the current version"

    def bounds(self) -> str:
        """One sentence on what η and the mode promise."""
        eta = self.staleness
        if self.mode == "async":
            policy = policy_named(self.staleness_policy, self.recycle_keep_prefix)
            return (f"η={eta}, async, staleness_policy={policy.name}: a group starts only while the slowest trainer "
                    f"is ≤ {versions(eta)} behind; {policy.bound_at(eta)}; weights reach generation ≤ "
                    f"{versions(eta)} old")
        if self.mode == "lagged":
            return (f"lagged, η={eta}: generation waits for training and samples with the weights exactly "
                    f"{versions(eta)} old")
        return "η=0, sync: generation waits for training; every sample is drawn with the current weights"

    def view(self, graph: Graph) -> PlanView:
        """The plan as plain data for the graph layer's drawings (`areal viz`); `graph` is the one compiled."""
        gated = {(c.src, c.dst) for c in self.gated()}
        channels = tuple(ChannelView(c.src, c.dst, c.fields, self.gate_bound() if (c.src, c.dst) in gated else "")
                         for c in self.channels)
        routes = tuple(RouteView(e.src, e.dst, "same process: current weights"
                                 if self.pool_of(e.src).name == self.pool_of(e.dst).name else self.weights_bound())
                       for e in graph.control_edges())
        pools = tuple(PoolView(p.name, p.nodes, self._caption(p)) for p in self.pools)
        return PlanView(pools, channels, routes, self.bounds())

    # -- JSON -------------------------------------------------------------------------------

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Plan:
        raw = json.loads(text)
        raw["pools"] = tuple(PoolSpec(**_tuples(p)) for p in raw["pools"])
        raw["channels"] = tuple(Channel(**_tuples(c)) for c in raw["channels"])
        for name in ("overrides", "bindings", "weights_routes", "colocated"):
            raw[name] = tuple(tuple(x) if isinstance(x, list) else x for x in raw[name])
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})

    # -- showing it --------------------------------------------------------------------------

    def render(self, width: int, lands_on: dict[str, list[str]] | None = None) -> Table | Tree:
        """The table where a terminal is wide enough for its columns, else one stacked entry per pool."""
        return self.table(lands_on) if width >= WIDE_TABLE_COLUMNS else self.tree(lands_on)

    def tree(self, lands_on: dict[str, list[str]] | None = None) -> Tree:
        """The plan as a tree: each pool, then one line per fact (fits 80 columns; long endpoints wrap)."""
        root = Tree(f"plan of graph '{self.graph}'  (run dir {self.run_dir})")
        for p in self.pools:
            pool = root.add(f"[bold]{p.name}[/]  {self._role(p)}")
            pool.add("nodes: " + ", ".join(f"{n} ({k})" for n, k in zip(p.nodes, p.kinds)))
            pool.add(self._where(p))
            for c in self.inputs_of(p.name):
                channel = pool.add(f"from {c.src}: {_fields(c)}")
                channel.add(f"on {', '.join(c.endpoints)}")
                if c in self.gated():
                    channel.add(f"gated: {self.gate_bound()}")
            if lands_on is not None and p.role != "source":
                pool.add("lands on: " + "; ".join(_landing(lands_on.get(p.name, []), p.gpus).splitlines()))
        root.add(f"control: {self.control_endpoint}")
        root.add(f"weights: {self._routes()}")
        root.add(f"staleness: {self.bounds()}")
        return root

    def table(self, lands_on: dict[str, list[str]] | None = None) -> Table:
        """`lands_on`: pool -> the machine of each replica (Ray's placement), shown when given."""
        t = Table(title=f"plan of graph '{self.graph}'  (run dir {self.run_dir})", show_lines=True)
        for col in ("pool", "nodes", "role", "replicas", "threads", "gpus", "receives", "sends to"):
            t.add_column(col)
        if lands_on is not None:
            t.add_column("lands on")
        for p in self.pools:
            t.add_row(
                p.name,
                "\n".join(f"{n} ({k})" for n, k in zip(p.nodes, p.kinds)),
                self._role(p),
                str(p.replicas),
                str(p.threads),
                str(p.gpus),
                "\n".join(f"{c.src}: {_fields(c)}\n  on {', '.join(c.endpoints)}"
                          + (f"\n  gated: {self.gate_bound()}" if c in self.gated() else "")
                          for c in self.inputs_of(p.name)) or "—",
                "\n".join(f"{c.dst} ({c.routing}, hwm {self.high_water_mark})" for c in self.outputs_of(p.name))
                or "—",
                *([] if lands_on is None else [_landing(lands_on.get(p.name, ["controller"]), p.gpus)]),
            )
        t.caption = f"control: {self.control_endpoint}   weights: {self._routes()}\nstaleness: {self.bounds()}"
        return t

    def _role(self, p: PoolSpec) -> str:
        joins = len(self.inputs_of(p.name))
        extra = [f"gathers {p.gather_groups} groups" if p.gather_groups > 1 else "",
                 f"joins {joins} inputs" if joins > 1 else "", f"{p.level}-level" if p.level == "group" else ""]
        return ", ".join([p.role, *[e for e in extra if e]])

    def _caption(self, p: PoolSpec) -> str:
        """A pool's frame caption in a picture: its role, then replicas and GPUs where there are several."""
        if p.role == "source":
            return "source, in the controller"
        extra = [f"×{p.replicas}" if p.replicas > 1 else "", f"{p.gpus} GPU each" if p.gpus else ""]
        return " ".join([self._role(p), *[e for e in extra if e]])

    def _where(self, p: PoolSpec) -> str:
        if p.role == "source":
            return "runs in the controller"
        return f"runs {p.replicas} replica(s) x {p.threads} thread(s), {p.gpus} GPU each"

    def _routes(self) -> str:
        """Each weights route with the way its versions travel, routes that travel alike together."""
        ways: dict[str, list[str]] = {}
        for trainer, follower in self.weights_routes:
            ways.setdefault(self._weights_way(trainer), []).append(f"{trainer} ⇢ {follower}")
        return "; ".join(f"{', '.join(routes)} {way}" for way, routes in ways.items()) or "none"

    def weights_kind(self, model: str) -> str:
        """How `model`'s versions travel: the sampled policy's by transport.weights, another trained model's
        (a critic's) as files."""
        return self.weights_transport if model == self.policy else "files"

    def _weights_way(self, trainer: str) -> str:
        kind = self.weights_kind(trainer)
        way = WEIGHTS_WAYS.get(kind, f"by transport {kind!r}")
        return way.format(weights_dir=self.weights_dir, rendezvous=self.weights_rendezvous)


def _tuples(raw: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}


def _fields(c: Channel) -> str:
    return ", ".join(c.fields) or "(ids only)"


def _landing(nodes: list[str], gpus: int) -> str:
    """Replica r on its node, with the GPUs Ray gives it (it sees only those, as cuda:0...)."""
    device = f", {gpus} GPU" if gpus else ""
    return "\n".join(f"[{r}] {node}{device}" for r, node in enumerate(nodes))

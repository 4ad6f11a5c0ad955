"""The compiled plan: which process runs which nodes, and how they are wired.

A `Plan` is plain data (frozen dataclasses of strings and ints), printable as a table and
serialisable to JSON, so `plan.json` in the run directory is enough to read or repeat a run.
Pools form a pipeline in data order; each replica of a pool binds one PULL endpoint and every
replica of the pool before it connects a PUSH to all of them (ZeroMQ load-balances). A trainer
pool's replicas are the ranks of one data-parallel trainer: rank 0 alone binds an endpoint.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from rich.table import Table
from rich.tree import Tree

WIDE_TABLE_COLUMNS = 140  # narrower terminals get `Plan.tree`: the table's 9 columns would each be cut


@dataclass(frozen=True)
class PoolSpec:
    name: str
    nodes: tuple[str, ...]  # run in this order inside one process, batch by batch
    kinds: tuple[str, ...]
    role: str  # "source" (the controller), "stream" (generate first), "train" (has ppo-update), "map"
    replicas: int
    threads: int
    endpoints: tuple[str, ...] = ()  # one PULL endpoint per replica (none for the source)
    gather_groups: int = 1  # groups gathered before the pool's nodes run (B for a trainer)
    # a trainer of several ranks: only rank 0 has an endpoint (it passes each step on, areal/runtime/ranks.py);
    # the ranks' torch.distributed rendezvous, host:port
    rendezvous: str = ""
    gpus: int = 0  # per replica: what Ray reserves for it (and makes the only GPUs it sees)

    def worker_ids(self) -> list[str]:
        return [f"{self.name}[{r}]" for r in range(self.replicas)]


@dataclass(frozen=True)
class Plan:
    graph: str
    recipe: str
    overrides: tuple[str, ...]
    run_dir: str
    pools: tuple[PoolSpec, ...]
    control_endpoint: str
    weights_route: tuple[tuple[str, str], ...]  # (trainer pool, pool that receives its weights)
    weights_dir: str
    high_water_mark: int
    max_frame_bytes: int
    max_header_bytes: int
    colocated: tuple[tuple[str, ...], ...] = field(default=())
    weights_rendezvous: str = ""  # transport.weights=broadcast: host:port of the weights group's store
    secured: bool = False  # TCP sockets: every one is armed with the run's CURVE key (security.py)

    def sender_limits(self) -> dict[str, int]:
        """What every PUSH end of the run is built with: the queue depth and the receivers' frame limits."""
        return {"hwm": self.high_water_mark, "max_frame_bytes": self.max_frame_bytes,
                "max_header_bytes": self.max_header_bytes}

    def weights_members(self) -> dict[str, int]:
        """Worker id -> member of the weights group: 0 the trainer's rank 0, then each generator replica."""
        members = {f"{self.weights_route[0][0]}[0]": 0} if self.weights_route else {}
        for pool in dict.fromkeys(dst for _, dst in self.weights_route):
            for worker in self.pool(pool).worker_ids():
                members[worker] = len(members)
        return members

    def pool(self, name: str) -> PoolSpec:
        return next(p for p in self.pools if p.name == name)

    def next_pool(self, name: str) -> PoolSpec | None:
        names = [p.name for p in self.pools]
        i = names.index(name)
        return self.pools[i + 1] if i + 1 < len(self.pools) else None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Plan:
        raw = json.loads(text)
        pools = tuple(
            PoolSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in p.items()}) for p in raw.pop("pools")
        )
        return cls(
            pools=pools,
            overrides=tuple(raw.pop("overrides")),
            weights_route=tuple(tuple(r) for r in raw.pop("weights_route")),
            colocated=tuple(tuple(c) for c in raw.pop("colocated")),
            **raw,
        )

    def render(self, width: int, lands_on: dict[str, list[str]] | None = None) -> Table | Tree:
        """The table where a terminal is wide enough for its columns, else one stacked entry per pool."""
        return self.table(lands_on) if width >= WIDE_TABLE_COLUMNS else self.tree(lands_on)

    def tree(self, lands_on: dict[str, list[str]] | None = None) -> Tree:
        """The plan as a tree: each pool, then one line per fact (fits 80 columns; long endpoints wrap)."""
        root = Tree(f"plan of graph '{self.graph}'  (run dir {self.run_dir})")
        for p in self.pools:
            nxt = self.next_pool(p.name)
            gathers = f", gathers {p.gather_groups} groups" if p.gather_groups > 1 else ""
            where = "in the controller" if p.role == "source" else f"{p.replicas} x {p.threads} thread(s), {p.gpus} GPU"
            pool = root.add(f"[bold]{p.name}[/]  {p.role}{gathers}; {where}")
            pool.add("nodes: " + ", ".join(f"{n} ({k})" for n, k in zip(p.nodes, p.kinds)))
            if p.endpoints:
                pool.add("receives on: " + ", ".join(p.endpoints))
            pool.add(f"sends to: {nxt.name} (PUSH, hwm {self.high_water_mark})" if nxt else "sends to: —")
            if lands_on is not None and p.role != "source":
                pool.add("lands on: " + "; ".join(_landing(lands_on.get(p.name, []), p.gpus).splitlines()))
        root.add(f"control: {self.control_endpoint}")
        root.add(f"weights: {self._route()}")
        return root

    def _route(self) -> str:
        route = ", ".join(f"{a} ⇢ {b}" for a, b in self.weights_route) or "none"
        way = (f"over a process group ({self.weights_rendezvous})" if self.weights_rendezvous
               else f"via {self.weights_dir}")
        return f"{route} {way}"

    def table(self, lands_on: dict[str, list[str]] | None = None) -> Table:
        """`lands_on`: pool -> the machine of each replica (Ray's placement), shown when given."""
        t = Table(title=f"plan of graph '{self.graph}'  (run dir {self.run_dir})", show_lines=True)
        for col in ("pool", "nodes", "role", "replicas", "threads", "gpus", "receives on", "sends to"):
            t.add_column(col)
        if lands_on is not None:
            t.add_column("lands on")
        for p in self.pools:
            nxt = self.next_pool(p.name)
            t.add_row(
                p.name,
                "\n".join(f"{n} ({k})" for n, k in zip(p.nodes, p.kinds)),
                p.role + (f", gathers {p.gather_groups} groups" if p.gather_groups > 1 else ""),
                str(p.replicas),
                str(p.threads),
                str(p.gpus),
                "\n".join(p.endpoints) or "—",
                f"{nxt.name} (PUSH, hwm {self.high_water_mark})" if nxt else "—",
                *([] if lands_on is None else [_landing(lands_on.get(p.name, ["controller"]), p.gpus)]),
            )
        t.caption = f"control: {self.control_endpoint}   weights: {self._route()}"
        return t


def _landing(nodes: list[str], gpus: int) -> str:
    """Replica r on its node, with the GPUs Ray gives it (it sees only those, as cuda:0...)."""
    device = f", {gpus} GPU" if gpus else ""
    return "\n".join(f"[{r}] {node}{device}" for r, node in enumerate(nodes))

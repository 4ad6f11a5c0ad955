"""Where worker processes run: local child processes (launchers.py), or Ray actors in placement groups
(ray_launcher.py), as `cluster.backend` says. The controller asks the `Launcher` this module picks to start
one worker (a pool replica) and gets back a handle it can poll and kill, whatever started it. Both launchers run
the same thing, the worker main loop of `areal.runtime.worker.main` with the same arguments; only the process's
origin differs.

Which pool goes where under Ray is the config's: `cluster.resources` gives a pool's replicas the custom
resources of the nodes they must land on (`{"rollout": {"gen": 1}}`, for nodes started with
`--resources='{"gen": 2}'`), `cluster.strategies` spreads or packs a pool (`{"rollout": "STRICT_SPREAD"}`), and
`areal viz --plan` shows where each replica lands (`lands_on`). transport.weights=auto is decided here, from
where the replicas were reserved, before any worker starts (`weights_landing`).

Not here: choosing endpoints (compile does), restarting workers (the controller does).
"""

from __future__ import annotations

from pathlib import Path

from areal.config import ClusterConfig
from areal.runtime.compiler.plan import Plan
from areal.runtime.controller.launchers import (
    Launcher,
    LocalLauncher,
    WorkerHandle,
    WorkerSpec,
    worker_spec,
)
from areal.runtime.controller.ray_launcher import RayHandle, RayLauncher, check_endpoints, ray_session

__all__ = ["Launcher", "LocalLauncher", "RayHandle", "RayLauncher", "WorkerHandle", "WorkerSpec",
           "check_endpoints", "lands_on", "launcher_for", "weights_landing", "worker_spec"]


def lands_on(plan: Plan, cluster: ClusterConfig) -> dict[str, list[str]]:
    """Pool -> the machine each replica would run on now: this one, or under Ray the node its bundle gets."""
    if cluster.backend == "local":
        return {p.name: ["this machine"] * p.replicas for p in plan.pools[1:]}
    launcher = launcher_for(cluster, plan)
    assert isinstance(launcher, RayLauncher)
    shown: dict[str, list[str]] = {p.name: [] for p in plan.pools[1:]}
    for pool, _, node in launcher.landing(_specs(plan), keep=False):
        shown[pool].append(launcher.label_of(node) if node else "?")
    return shown


def weights_landing(plan: Plan, cluster: ClusterConfig) -> list[tuple[str, int, str]]:
    """(pool, replica, host) of every replica, before any starts: under Ray its bundle is reserved now and kept for
    it, so what transport.weights=auto decides from this is where the workers run."""
    launcher = launcher_for(cluster, plan)
    if not isinstance(launcher, RayLauncher):
        return [(p.name, r, "local") for p in plan.pools[1:] for r in range(p.replicas)]
    return launcher.landing(_specs(plan), keep=True)


def launcher_for(cluster: ClusterConfig, plan: Plan) -> Launcher:
    """The launcher a run's cluster config asks for. Ray state is kept per Ray session (one per process); a Ray
    the run starts itself is told the CPUs the plan's pools take."""
    if cluster.backend == "local":
        return LocalLauncher()
    session = ray_session()
    key = cluster.model_dump_json()  # the config holds dicts: not hashable itself
    launcher = _RAY_LAUNCHERS.get(key)
    if launcher is None or session is None or launcher.session != session:
        cpus = sum(p.threads * p.replicas for p in plan.pools[1:])
        launcher = _RAY_LAUNCHERS[key] = RayLauncher(cluster, cpus)
    return launcher


def _specs(plan: Plan) -> list[WorkerSpec]:
    return [worker_spec(plan, Path(plan.run_dir) / "plan.json", p.name, 0, 0, None, Path("unused.log"))
            for p in plan.pools[1:]]


_RAY_LAUNCHERS: dict[str, RayLauncher] = {}

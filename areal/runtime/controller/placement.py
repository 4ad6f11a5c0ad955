"""Where worker processes run: local child processes, or Ray actors in placement groups.

The controller asks a `Launcher` to start one worker (a pool replica) and gets back a handle it
can poll and kill, whatever started it. Both launchers run the same thing, the worker main loop
of `areal.runtime.worker.main` with the same arguments; only the process's origin differs:

- `LocalLauncher`: a child process in its own session, killed with its whole group, and told by
  Linux to die when the controller dies; whatever it started dies with it (its guard, reaper.py);
- `RayLauncher`: each pool gets a placement group with one bundle per replica (the pool's threads
  as CPUs, its GPUs), and each replica is an actor in its bundle that runs the worker main loop
  in the actor's process. The data plane stays ZeroMQ over TCP between those processes; Ray only
  places, starts and kills them (and kills them when the controller's job ends).

Not here: choosing endpoints (compile does), restarting workers (the controller does).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from areal.config import ClusterConfig
from areal.errors import ConfigError, RunError
from areal.runtime.compiler.cluster import import_ray
from areal.runtime.compiler.plan import Plan

KILL_WAIT_S = 10.0


@dataclass(frozen=True)
class WorkerSpec:
    """One replica to start: `args` are `areal.runtime.worker.main`'s command-line arguments."""

    pool: str
    replica: int
    replicas: int  # of the pool: Ray reserves them together
    args: tuple[str, ...]
    log_path: Path
    cpus: int = 1
    gpus: int = 0
    run_dir: str = ""
    endpoints: tuple[str, ...] = ()  # every endpoint of the plan (control and data)
    one_node: bool = False  # the pool's replicas meet on 127.0.0.1 (a trainer's ranks): Ray keeps them together

    @property
    def worker_id(self) -> str:
        return f"{self.pool}[{self.replica}]"


class WorkerHandle(Protocol):
    """A started worker: `poll` gives its exit code once it ended; `kill` ends it and what it started."""

    pid: int  # the worker process's pid (on its node, for Ray)
    node: str  # where it runs: "local", or the Ray node's IP

    def poll(self) -> int | None: ...
    def kill(self) -> None: ...


class Launcher(Protocol):
    def start(self, spec: WorkerSpec) -> WorkerHandle: ...


def worker_spec(plan: Plan, plan_path: Path, pool: str, replica: int, version: int, resume_dir: Path | None,
                log_path: Path) -> WorkerSpec:
    """What the plan asks for one replica: the worker's arguments and its pool's resources."""
    spec = plan.pool(pool)
    args = (str(plan_path), pool, str(replica), str(version))
    return WorkerSpec(
        pool=pool, replica=replica, replicas=spec.replicas,
        args=args + ((str(resume_dir),) if resume_dir else ()), log_path=log_path,
        cpus=spec.threads, gpus=spec.gpus, run_dir=plan.run_dir, one_node=bool(spec.rendezvous),
        endpoints=tuple(plan.bound_endpoints()),
    )


def lands_on(plan: Plan, cluster: ClusterConfig) -> dict[str, list[str]]:
    """Pool -> the machine each replica would run on now: this one, or under Ray the node its bundle gets."""
    if cluster.backend == "local":
        return {p.name: ["this machine"] * p.replicas for p in plan.pools[1:]}
    launcher = launcher_for(cluster)
    assert isinstance(launcher, RayLauncher)
    specs = [worker_spec(plan, Path("plan.json"), p.name, 0, 0, None, Path("unused.log")) for p in plan.pools[1:]]
    return {spec.pool: launcher.nodes_of(spec) for spec in specs}


def launcher_for(cluster: ClusterConfig) -> Launcher:
    """The launcher a run's cluster config asks for. Ray state is kept per Ray session (one per process)."""
    if cluster.backend == "local":
        return LocalLauncher()
    session = _ray_session()
    launcher = _RAY_LAUNCHERS.get(cluster)
    if launcher is None or session is None or launcher.session != session:
        launcher = _RAY_LAUNCHERS[cluster] = RayLauncher(cluster)
    return launcher


# ---- local processes -------------------------------------------------------------------------------


class LocalHandle:
    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.pid = process.pid
        self.node = "local"

    def poll(self) -> int | None:
        return self.process.poll()

    def kill(self) -> None:
        """Kill the worker's whole session (it and the processes it started) by its pid."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait(timeout=KILL_WAIT_S)


class LocalLauncher:
    def start(self, spec: WorkerSpec) -> LocalHandle:
        argv = [sys.executable, "-m", "areal.runtime.worker.main", *spec.args]
        with open(spec.log_path, "ab") as out:
            # own session: the worker and whatever it starts (sandbox processes) die together
            # and die with the controller: a kill -9 of the run must not leave workers behind
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True, preexec_fn=_die_with_parent,
                                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
        return LocalHandle(process)


def _die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGKILL us when the controller dies."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


# ---- Ray actors -------------------------------------------------------------------------------------


def _ray_session() -> str | None:
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return str(ray.get_runtime_context().get_job_id())


class WorkerActor:
    """Runs in the actor's own process (made a Ray actor class by `RayLauncher`)."""

    def where(self) -> tuple[int, str]:
        import ray

        return os.getpid(), str(ray.util.get_node_ip_address())

    def run(self, args: list[str], log_path: str) -> int:
        """The worker main loop, with stdout and stderr (fds 1 and 2) appended to the worker's log."""
        from areal.runtime.worker import main as worker

        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.environ["PYTHONUNBUFFERED"] = "1"
        os.environ["AREAL_NODE_IP"] = self.where()[1]  # transport.host=node binds the worker's sockets here
        return worker.main(args)


class RayHandle:
    def __init__(self, launcher: RayLauncher, spec: WorkerSpec, actor: Any, pid: int, node: str) -> None:
        self.launcher, self.spec, self.actor = launcher, spec, actor
        self.pid, self.node = pid, node
        self._done = actor.run.remote(list(spec.args), str(spec.log_path))
        self._code: int | None = None
        self._released = False

    def poll(self) -> int | None:
        if self._code is None:
            ray = self.launcher.ray
            ready, _ = ray.wait([self._done], timeout=0)
            if ready:
                try:
                    self._code = int(ray.get(self._done))
                except ray.exceptions.RayActorError:
                    self._code = -signal.SIGKILL  # the actor's process died (killed, or crashed)
                except ray.exceptions.RayError:
                    self._code = 1
                # an actor outlives its method and holds its bundle: end it like a process that exited
                ray.kill(self.actor, no_restart=True)
                self._release()
        return self._code

    def kill(self) -> None:
        ray = self.launcher.ray
        ray.kill(self.actor, no_restart=True)
        ray.wait([self._done], timeout=KILL_WAIT_S)
        self.poll()
        self._release()

    def _release(self) -> None:
        """Once per handle: a restarted replica's new actor must not be released by its predecessor."""
        if not self._released:
            self._released = True
            self.launcher.release(self.spec)


class RayLauncher:
    """One placement group per pool (a bundle per replica); one actor per replica in its bundle."""

    def __init__(self, cluster: ClusterConfig) -> None:
        self.ray = import_ray()
        self.cluster = cluster
        if not self.ray.is_initialized():
            # None starts a Ray of this run's own ("local": Ray would otherwise join whatever cluster
            # this machine last started); "auto" or "ray://..." joins a cluster
            self.ray.init(address=cluster.address or "local", include_dashboard=False, log_to_driver=False)
        self.session = _ray_session()
        self._actor_class = self.ray.remote(max_restarts=0)(WorkerActor)
        self._groups: dict[tuple[str, str], Any] = {}  # (run dir, pool) -> placement group
        self._live: dict[tuple[str, str], set[int]] = {}  # (run dir, pool) -> replicas with a live actor

    def start(self, spec: WorkerSpec) -> RayHandle:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        check_endpoints(spec.endpoints)
        group = self._group(spec)
        actor = self._actor_class.options(
            num_cpus=spec.cpus, num_gpus=spec.gpus,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=spec.replica),
        ).remote()
        try:
            pid, node = self.ray.get(actor.where.remote(), timeout=self.cluster.ready_timeout_s)
        except self.ray.exceptions.GetTimeoutError:
            self.ray.kill(actor, no_restart=True)
            raise RunError(f"worker {spec.worker_id}: its Ray actor did not start within "
                           f"{self.cluster.ready_timeout_s:.0f} s (raise cluster.ready_timeout_s?)") from None
        self._live.setdefault((spec.run_dir, spec.pool), set()).add(spec.replica)
        return RayHandle(self, spec, actor, int(pid), str(node))

    def nodes_of(self, spec: WorkerSpec) -> list[str]:
        """The node (IP) each replica of the spec's pool would land on now: its group reserved, read, released."""
        group = self._group(spec)
        try:
            ips = {n["NodeID"]: n["NodeManagerAddress"] for n in self.ray.nodes()}
            bundles = self.ray.util.placement_group_table(group)["bundles_to_node_id"]
            return [ips.get(bundles[i], "?") for i in range(spec.replicas)]
        finally:
            self.ray.util.remove_placement_group(self._groups.pop((spec.run_dir, spec.pool)))

    def release(self, spec: WorkerSpec) -> None:
        """A replica's actor is gone; once the whole pool is gone, free its placement group."""
        key = (spec.run_dir, spec.pool)
        live = self._live.get(key, set())
        live.discard(spec.replica)
        if not live and key in self._groups:
            self.ray.util.remove_placement_group(self._groups.pop(key))

    def _group(self, spec: WorkerSpec) -> Any:
        key = (spec.run_dir, spec.pool)
        if key not in self._groups:
            bundle = {"CPU": spec.cpus, **({"GPU": spec.gpus} if spec.gpus else {})}
            group = self.ray.util.placement_group([dict(bundle) for _ in range(spec.replicas)],
                                                  strategy="STRICT_PACK" if spec.one_node else self.cluster.strategy)
            ready, _ = self.ray.wait([group.ready()], timeout=self.cluster.ready_timeout_s)
            if not ready:
                self.ray.util.remove_placement_group(group)
                total = {k: v * spec.replicas for k, v in bundle.items()}
                raise RunError(
                    f"pool '{spec.pool}': Ray could not reserve {spec.replicas} x {bundle} (total {total}) within "
                    f"{self.cluster.ready_timeout_s:.0f} s; the cluster has {self.ray.available_resources()} free. "
                    f"Lower the pool's replicas or threads, or add nodes"
                )
            self._groups[key] = group
        return self._groups[key]


def check_endpoints(endpoints: tuple[str, ...]) -> None:
    """Ray workers may sit on other machines: every endpoint must be TCP."""
    ipc = [e for e in endpoints if not e.startswith("tcp://")]
    if ipc:
        raise ConfigError(
            f"cluster.backend=ray: endpoint {ipc[0]} is not TCP; Ray workers may run on other machines. "
            f"Use --set transport.kind=tcp"
        )


_RAY_LAUNCHERS: dict[ClusterConfig, RayLauncher] = {}

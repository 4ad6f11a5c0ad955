"""Workers as Ray actors: each pool gets a placement group with one bundle per replica (the pool's threads as
CPUs, its GPUs, and the custom resources `cluster.resources` names for it, placed by its strategy), and each
replica is an actor in its bundle that runs the worker main loop in the actor's process. The data plane stays
ZeroMQ over TCP between those processes; Ray only places, starts and kills them (and kills them when the
controller's job ends).

An actor is placed when Ray finds room for its bundle, which after a lost node may be never, or when a node
joins: starting one does not wait for it. The controller keeps running the rest of the run meanwhile, and the
handle says what its worker waits for (`waiting`). A node is named by its IP, and by its id where several
share one (a simulated cluster); hosts are compared by Ray node id.

With `cluster.shared_dir=false`, an actor that lands on another node than the controller's works in a copy of
the run directory in `cluster.scratch_dir` (storage/mirror.py): it gets the plan, the run's key, the recipe and
the checkpoint it resumes from through Ray's object store, and its plan names the real run directory, to which
it sends what it writes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from areal.config import ClusterConfig
from areal.errors import ConfigError, RunError
from areal.runtime.compiler.cluster import import_ray
from areal.runtime.compiler.plan import Plan
from areal.runtime.controller.launchers import KILL_WAIT_S, WorkerSpec
from areal.runtime.storage.mirror import file_stem, leftovers
from areal.runtime.storage.resume import RECIPE_COPY
from areal.runtime.wire.security import KEY_FILE

log = logging.getLogger("areal.controller")

Landing = tuple[str, int, str]  # (pool, replica, Ray node id) of one reserved bundle


def ray_session() -> str | None:
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return str(ray.get_runtime_context().get_job_id())


class WorkerActor:
    """Runs in the actor's own process (made a Ray actor class by `RayLauncher`)."""

    def __init__(self) -> None:
        self.ended: tuple[int, str | None] | None = None  # how `run` ended: its exit code, what it raised

    def where(self) -> tuple[int, str, str]:
        import ray

        return os.getpid(), str(ray.util.get_node_ip_address()), str(ray.get_runtime_context().get_node_id())

    def run(self, args: list[str], log_path: str, away: dict[str, Any] | None = None) -> int:
        """The worker main loop, with stdout and stderr (fds 1 and 2) appended to the worker's log. `away`: how to
        make a copy of the run directory, when this node is not the controller's and does not share it."""
        from areal.runtime.worker import main as worker

        node = self.where()[2]
        if away is not None and node != away["home"]:
            args, log_path = _into_copy(args, log_path, away, node)
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.environ["PYTHONUNBUFFERED"] = "1"
        os.environ["AREAL_NODE_IP"] = self.where()[1]  # transport.host=node binds the worker's sockets here
        try:
            code = worker.main(args)
        except BaseException as err:
            self.ended = (1, f"{type(err).__name__}: {err}")
            raise
        self.ended = (code, None)
        return code

    def ending(self) -> tuple[int, str | None] | None:
        """How `run` ended. The actor takes one call at a time, so this one, made while `run` runs, answers when
        it has returned (`RayHandle.poll` asks it after losing `run`'s own result to a connection blip)."""
        return self.ended


def _into_copy(args: list[str], log_path: str, away: dict[str, Any], node: str) -> tuple[list[str], str]:
    """Write the run's inputs into this node's copy of the run directory; the arguments and log path there."""
    import ray

    home = Path(away["run_dir"])
    local = Path(away["scratch"]) / f"{home.name}-{node[:12]}"
    for old in leftovers(local, file_stem(f"{args[1]}[{args[2]}]")):  # a predecessor's: sent, or lost with it
        old.unlink()
    inputs, plan_name = ray.get(away["inputs"][0]), Path(args[0]).name
    for name, data in inputs.items():
        if name != plan_name:  # the plan goes in as this copy's only: another actor may be reading it already
            _replace(local / name, data)
    plan = dataclasses.replace(Plan.from_json(inputs[plan_name].decode()), run_dir=str(local),
                               weights_dir=str(local / "weights"), recipe=str(local / RECIPE_COPY),
                               home_run_dir=str(home))
    _replace(local / plan_name, plan.to_json().encode())
    moved = [str(local / Path(a).relative_to(home)) if i in (0, 4) else a for i, a in enumerate(args)]
    return moved, str(local / Path(log_path).relative_to(home))


def _replace(path: Path, data: bytes) -> None:
    """`path` holds `data` (readable by this user only), written under a name of its own and renamed: the other
    actors of this node write the same inputs into the same copy, and one reading a file while another rewrote it
    in place read it empty. (storage's `write_atomically` has one writer, the controller: a fixed temporary name.)"""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0o600
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def ray_cause(err: Exception, limit: int = 300) -> str:
    """Ray's own account of why an actor's call failed (its node died, a health check, `ray.kill`), or the
    exception the call raised (a task error's `cause`: Ray's text of it is mostly the traceback's frames), in one
    line: an exit code alone cannot tell these apart."""
    cause = getattr(err, "cause", None)
    text = f"{type(cause).__name__}: {cause}" if isinstance(cause, BaseException) else str(err)
    text = " ".join(text.split())
    return f"Ray: {text[:limit]}" + ("..." if len(text) > limit else "")


class RayHandle:
    def __init__(self, launcher: RayLauncher, spec: WorkerSpec, actor: Any) -> None:
        self.launcher, self.spec, self.actor = launcher, spec, actor
        self.pid, self.node, self.host = 0, "(not placed)", ""
        self._where = actor.where.remote()
        self._done = actor.run.remote(list(spec.args), str(spec.log_path), launcher.away(spec))
        self._since = time.monotonic()
        self._code: int | None = None
        self.ended_by: str | None = None
        self._released = False

    def placed(self) -> bool:
        """Whether Ray has started the actor (its pid, node and host are known from then on)."""
        if not self.host:
            ray = self.launcher.ray
            if ray.wait([self._where], timeout=0)[0]:
                try:
                    pid, ip, node = ray.get(self._where)
                except ray.exceptions.RayError:
                    return False  # it died before saying where (`poll` has its exit), or the answer was lost
                self.pid, self.host, self.node = int(pid), str(node), self.launcher.label(ip, node)
        return bool(self.host)

    def waiting(self) -> str | None:
        if self._code is not None or self.placed():
            return None
        return self.launcher.waiting_for(self.spec, time.monotonic() - self._since)

    def poll(self) -> int | None:
        if self._code is None:
            self.placed()
            ray = self.launcher.ray
            ready, _ = ray.wait([self._done], timeout=0)
            if ready:
                try:
                    self._code, self.ended_by = self._outcome(ray.get(self._done))
                except ray.exceptions.ActorUnavailableError as err:
                    # the connection to the actor failed while it was alive (Ray: the call "may or may not have
                    # been executed"): its worker may still run, so it is not ended. Ask it how `run` ends
                    # instead, a call that answers once run returns, or fails if the actor dies meanwhile
                    log.warning("%s: the connection to its Ray actor failed (%s); it may still run, so it is "
                                "asked how its run ends", self.spec.worker_id, ray_cause(err))
                    self._done = self.actor.ending.remote()
                    return None
                except ray.exceptions.RayActorError as err:
                    self._code = -signal.SIGKILL  # the actor's process died (killed, crashed, its node lost)
                    self.ended_by = ray_cause(err)
                except ray.exceptions.RayError as err:
                    self._code = 1
                    self.ended_by = ray_cause(err)
                # an actor outlives its method and holds its bundle: end it like a process that exited
                ray.kill(self.actor, no_restart=True)
                self._release()
        return self._code

    def _outcome(self, result: int | tuple[int, str | None] | None) -> tuple[int, str | None]:
        """The exit code and the cause of `run`'s result, or of `ending`'s (after a blip)."""
        if isinstance(result, int):
            return result, None
        if result is None:  # the actor takes calls in turn: `run`, lost with the connection, never reached it
            return 1, "Ray: its run call was lost before it started (the connection to its actor failed)"
        code, raised = result
        return code, None if raised is None else f"its run raised {raised}"

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

    def __init__(self, cluster: ClusterConfig, cpus_wanted: int = 0) -> None:
        self.ray = import_ray()
        self.cluster = cluster
        # a Ray this run starts on this machine: no node ever joins it, so what it lacks is never waited for
        self.own = cluster.address is None and not self.ray.is_initialized()
        if self.own:
            # "local": Ray would otherwise join whatever cluster this machine last started. Told the CPUs the pools
            # take where the machine has fewer cores: they share the cores, as under cluster.backend=local
            cores = os.cpu_count() or 1
            if cpus_wanted > cores:
                log.warning("cluster.backend=ray without cluster.address: this run's own Ray on this machine is "
                            "given %d CPUs, the pools' threads, for its %d cores: the pools share them, as under "
                            "cluster.backend=local", cpus_wanted, cores)
            self.ray.init(address="local", num_cpus=max(cores, cpus_wanted), include_dashboard=False,
                          log_to_driver=False)
        elif not self.ray.is_initialized():  # "auto" or "ray://...": join a cluster
            self.ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
        self.session = ray_session()
        self.home = str(self.ray.get_runtime_context().get_node_id())  # the controller's node
        self._actor_class = self.ray.remote(max_restarts=0)(WorkerActor)
        self._groups: dict[tuple[str, str], Any] = {}  # (run dir, pool) -> placement group
        self._reserved: set[tuple[str, str]] = set()  # pools reserved once: a new group for one is not waited for
        self._live: dict[tuple[str, str], set[int]] = {}  # (run dir, pool) -> replicas with a live actor
        self._inputs: dict[tuple[str, ...], Any] = {}  # (run dir, resumed checkpoint) -> what a copy is made of

    def start(self, spec: WorkerSpec) -> RayHandle:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        check_endpoints(spec.endpoints)
        group = self._group(spec)
        actor = self._actor_class.options(
            num_cpus=spec.cpus, num_gpus=spec.gpus,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=spec.replica),
        ).remote()
        self._live.setdefault((spec.run_dir, spec.pool), set()).add(spec.replica)
        return RayHandle(self, spec, actor)

    def landing(self, specs: list[WorkerSpec], keep: bool) -> list[Landing]:
        """Where each replica of each spec's pool would land now: its group reserved and read (and released,
        unless `keep`, when the run's workers are to be started in it)."""
        landed = []
        for spec in specs:
            group = self._group(spec)
            try:
                bundles = self.ray.util.placement_group_table(group)["bundles_to_node_id"]
                landed += [(spec.pool, i, str(bundles.get(i, ""))) for i in range(spec.replicas)]
            finally:
                if not keep:
                    self.ray.util.remove_placement_group(self._groups.pop((spec.run_dir, spec.pool)))
                    self._reserved.discard((spec.run_dir, spec.pool))
        return landed

    def label(self, ip: str, node: str) -> str:
        """How a node is shown: its IP, with the start of its id where other live nodes share the IP."""
        shared = sum(1 for n in self.ray.nodes() if n.get("Alive") and n.get("NodeManagerAddress") == ip) > 1
        return f"{ip}/{node[:6]}" if shared else ip

    def label_of(self, node: str) -> str:
        ip = next((n["NodeManagerAddress"] for n in self.ray.nodes() if n["NodeID"] == node), "?")
        return self.label(ip, node)

    def waiting_for(self, spec: WorkerSpec, waited_s: float) -> str | None:
        """What a replica whose actor has not started waits for: None when its bundle has a node (its process is
        starting), else the resources it needs and those free."""
        group = self._groups.get((spec.run_dir, spec.pool))
        table = self.ray.util.placement_group_table(group) if group is not None else {}
        if table.get("state") == "CREATED":
            return None
        return (f"{spec.worker_id} waits for Ray to place it ({waited_s:.0f} s): each '{spec.pool}' replica needs "
                f"{self._bundle(spec)}, the cluster has {self._free()} free; it starts when a node with room for it "
                "joins")

    def _free(self) -> dict[str, float]:
        """The cluster's free resources a bundle may ask for (not Ray's own bookkeeping of groups and nodes)."""
        return {k: v for k, v in self.ray.available_resources().items()
                if "_group_" not in k and not k.startswith("node:") and "memory" not in k}

    def away(self, spec: WorkerSpec) -> dict[str, Any] | None:
        """What an actor needs to make a copy of the run directory on a node without it; None when shared."""
        if self.cluster.shared_dir:
            return None
        home = Path(spec.run_dir)
        resumed = Path(spec.args[4]) if len(spec.args) > 4 else None
        key = (spec.run_dir, str(resumed))
        if key not in self._inputs:
            names = [Path(spec.args[0]).name, KEY_FILE, RECIPE_COPY]
            files = {name: (home / name).read_bytes() for name in names if (home / name).is_file()}
            if resumed is not None:
                files.update({str(p.relative_to(home)): p.read_bytes() for p in resumed.rglob("*") if p.is_file()})
            self._inputs[key] = self.ray.put(files)
        return {"home": self.home, "run_dir": spec.run_dir, "scratch": self.cluster.scratch_dir,
                "inputs": [self._inputs[key]]}  # in a list: Ray hands the actor the reference, not the files

    def release(self, spec: WorkerSpec) -> None:
        """A replica's actor is gone; once the whole pool is gone, free its placement group."""
        key = (spec.run_dir, spec.pool)
        live = self._live.get(key, set())
        live.discard(spec.replica)
        if not live and key in self._groups:
            self.ray.util.remove_placement_group(self._groups.pop(key))

    def _bundle(self, spec: WorkerSpec) -> dict[str, float]:
        named = self.cluster.resources.get(spec.pool, {})
        custom = {k: int(v) if float(v).is_integer() else v for k, v in named.items()}  # shown as declared
        return {"CPU": spec.cpus, **({"GPU": spec.gpus} if spec.gpus else {}), **custom}

    def _group(self, spec: WorkerSpec) -> Any:
        key = (spec.run_dir, spec.pool)
        if key not in self._groups:
            bundle = self._bundle(spec)
            strategy = "STRICT_PACK" if spec.one_node else self.cluster.strategies.get(spec.pool, self.cluster.strategy)
            group = self.ray.util.placement_group([dict(bundle) for _ in range(spec.replicas)], strategy=strategy)
            # the run's first reservation is waited for, so that a cluster without room says so at once; a pool
            # whose every replica died (a lost node) is started again without waiting: its workers say they wait
            if key not in self._reserved and self.own:
                self._check_own_ray_holds(spec, bundle)
            if key not in self._reserved:
                ready, _ = self.ray.wait([group.ready()], timeout=self.cluster.ready_timeout_s)
                if not ready:
                    self.ray.util.remove_placement_group(group)
                    total = {k: v * spec.replicas for k, v in bundle.items()}
                    raise RunError(
                        f"pool '{spec.pool}': Ray could not reserve {spec.replicas} x {bundle} ({strategy}, total "
                        f"{total}) within {self.cluster.ready_timeout_s:.0f} s; the cluster has "
                        f"{self._free()} free. Lower the pool's replicas or threads, or add nodes"
                    )
            self._reserved.add(key)
            self._groups[key] = group
        return self._groups[key]

    def _check_own_ray_holds(self, spec: WorkerSpec, bundle: dict[str, float]) -> None:
        """A RunError at once where this run's own Ray can never hold a pool (no node joins it): a GPU on a
        machine without one, a custom resource of cluster.resources."""
        totals = self.ray.cluster_resources()
        short = {k: v * spec.replicas for k, v in bundle.items() if v * spec.replicas > totals.get(k, 0)}
        if short:
            has = {k: totals.get(k, 0) for k in short}
            raise RunError(f"pool '{spec.pool}' needs {short} in all, and this run's own Ray on this machine has "
                           f"{has}; no node joins it: start a Ray cluster with them (ray start --resources=... "
                           "for custom ones) and join it with cluster.address=auto, or ask for fewer")


def check_endpoints(endpoints: tuple[str, ...]) -> None:
    """Ray workers may sit on other machines: every endpoint must be TCP."""
    ipc = [e for e in endpoints if not e.startswith("tcp://")]
    if ipc:
        raise ConfigError(
            f"cluster.backend=ray: endpoint {ipc[0]} is not TCP; Ray workers may run on other machines. "
            f"Use --set transport.kind=tcp"
        )

"""Launchers: the plan's resources reach the spec, Ray refuses what it cannot run, and a real
single-node Ray runs the small custom-node graph with every sample trained exactly once."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

from areal.cli.progress import live_table
from areal.cli.run import build_controller
from areal.config import ClusterConfig, RunConfig
from areal.errors import ConfigError, RunError
from areal.graph.recipe import load_recipe
from areal.overrides import apply_overrides
from areal.runtime.compiler.cluster import MISSING_RAY
from areal.runtime.compiler.compile import compile_plan
from areal.runtime.controller.placement import (
    RayHandle,
    RayLauncher,
    check_endpoints,
    lands_on,
    launcher_for,
    worker_spec,
)
from areal.runtime.wire.channels import bind_address
from tests.runtime.kills import exits_within

RECIPE = Path(__file__).with_name("fake_rl.py")


def _controller(tmp_path: Path, *overrides: str):
    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    return build_controller(recipe, list(overrides), tmp_path / "run")


def test_worker_spec_carries_the_pools_threads_replicas_and_every_endpoint(tmp_path):
    controller = _controller(tmp_path, "transport.kind=tcp", "placement={\"rollout\": 2}")
    plan = controller.plan
    spec = worker_spec(plan, tmp_path / "plan.json", "rollout", 1, 3, None, tmp_path / "log")
    assert spec.args == (str(tmp_path / "plan.json"), "rollout", "1", "3")
    assert (spec.worker_id, spec.replicas, spec.cpus, spec.gpus) == ("rollout[1]", 2, 1, 0)
    assert set(spec.endpoints) == set(plan.bound_endpoints())
    assert all(e.startswith("tcp://127.0.0.1:") for e in spec.endpoints)
    resumed = worker_spec(plan, tmp_path / "plan.json", "actor", 0, 3, tmp_path / "ckpt", tmp_path / "log")
    assert resumed.args[-1] == str(tmp_path / "ckpt")


def test_gpus_and_one_node_reach_the_spec_with_vllm_defaults_and_unknown_pools_named(tmp_path):
    recipe = load_recipe(RECIPE, ["generation.engine=vllm"])
    plan = compile_plan(recipe.graph, recipe.config)
    assert {p.name: p.gpus for p in plan.pools[1:]} == {"rollout": 1, "actor": 1}  # the map pool needs none
    recipe = load_recipe(RECIPE, ['gpus={"rollout": 2}', 'placement={"rollout": 2}'])
    plan = compile_plan(recipe.graph, recipe.config)
    spec = worker_spec(plan, tmp_path / "plan.json", "rollout", 1, 0, None, tmp_path / "log")
    assert (spec.gpus, plan.pool("actor").gpus) == (2, 0)
    assert not spec.one_node
    recipe = load_recipe(RECIPE, ["trainer.engine=fsdp", "trainer.ranks=2"])
    plan = compile_plan(recipe.graph, recipe.config)
    assert worker_spec(plan, tmp_path / "plan.json", "actor", 1, 0, None, tmp_path / "log").one_node  # STRICT_PACK
    recipe = load_recipe(RECIPE, ['gpus={"rolout": 1}'])
    with pytest.raises(ConfigError, match=r"gpus: no pool named 'rolout'; the pools are rollout, actor"):
        compile_plan(recipe.graph, recipe.config)


def test_ray_refuses_ipc_endpoints_and_says_how_to_fix_it():
    with pytest.raises(ConfigError, match=r"endpoint ipc:///r/sockets/control is not TCP.*--set transport.kind=tcp"):
        check_endpoints(("ipc:///r/sockets/control", "tcp://127.0.0.1:5000"))


def test_missing_ray_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError) as info:
        RayLauncher(ClusterConfig(backend="ray"))
    assert str(info.value) == MISSING_RAY


def test_transport_host_node_needs_ray_and_weights_as_files():
    with pytest.raises(ConfigError, match="transport.host=node binds on each Ray node's IP, which needs cluster"):
        apply_overrides(RunConfig(), ["transport.host=node"])
    with pytest.raises(ConfigError, match="still meets on one machine; use transport.weights=auto"):
        apply_overrides(RunConfig(), ["transport.host=node", "cluster.backend=ray", "transport.weights=broadcast"])


def test_a_worker_binds_host_node_on_the_ip_its_ray_actor_reported(monkeypatch):
    monkeypatch.setenv("AREAL_NODE_IP", "10.1.2.3")
    assert bind_address("tcp://node:*") == "tcp://10.1.2.3:*"
    assert bind_address("tcp://127.0.0.1:*") == "tcp://127.0.0.1:*"


def test_local_backend_is_the_local_launcher():
    recipe = load_recipe(RECIPE, [])
    assert type(launcher_for(ClusterConfig(), compile_plan(recipe.graph, recipe.config))).__name__ == "LocalLauncher"


@pytest.fixture
def local_ray():
    """A Ray of this test's own (never a cluster left running on this machine): 4 CPUs, shut down after."""
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.cluster
def test_the_plan_under_ray_shows_the_node_each_replica_lands_on_and_keeps_no_reservation(local_ray):
    recipe = load_recipe(RECIPE, ["cluster.backend=ray", 'placement={"rollout": 2}'])
    plan = compile_plan(recipe.graph, recipe.config)
    node = local_ray.util.get_node_ip_address()
    assert lands_on(plan, recipe.config.cluster) == {"rollout": [node, node], "actor": [node]}
    assert all(g["state"] == "REMOVED" for g in local_ray.util.placement_group_table().values())
    shown = plan.table(lands_on(plan, recipe.config.cluster)).columns[-1]
    assert shown.header == "lands on" and list(shown.cells)[1] == f"[0] {node}\n[1] {node}"


@pytest.mark.cluster
def test_a_cluster_without_room_for_a_pool_says_what_it_needs_and_the_cpus_free_after_ready_timeout(local_ray,
                                                                                                   tmp_path):
    recipe = load_recipe(RECIPE, ["cluster.backend=ray", 'placement={"rollout": 5}', "cluster.ready_timeout_s=1"])
    plan = compile_plan(recipe.graph, recipe.config)
    launcher = RayLauncher(recipe.config.cluster)  # joins the test's Ray of 4 CPUs: one it did not start
    with pytest.raises(RunError) as refused:
        launcher.start(worker_spec(plan, tmp_path / "plan.json", "rollout", 0, 0, None, tmp_path / "log"))
    assert str(refused.value) == ("pool 'rollout': Ray could not reserve 5 x {'CPU': 1} (PACK, total {'CPU': 5}) "
                                  "within 1 s; the cluster has {'CPU': 4.0} free. Lower the pool's replicas or "
                                  "threads, or add nodes")


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_a_ray_of_the_runs_own_is_given_the_pools_cpus_and_refuses_at_once_what_no_node_of_it_has(tmp_path):
    # more CPUs than the machine's cores: they share the cores, as under the local backend (a 2-core machine waited
    # 120 s for a third CPU); a GPU or a custom resource it lacks is said at once, not after ready_timeout_s
    ray = pytest.importorskip("ray")
    cores = os.cpu_count() or 1
    launcher = RayLauncher(ClusterConfig(backend="ray", ready_timeout_s=300, resources={"rollout": {"gen": 1}}),
                           cpus_wanted=cores + 3)
    try:
        assert ray.cluster_resources()["CPU"] == cores + 3
        recipe = load_recipe(RECIPE, ["cluster.backend=ray", 'placement={"rollout": 2}'])
        plan = compile_plan(recipe.graph, recipe.config)
        with pytest.raises(RunError, match=r"pool 'rollout' needs \{'gen': 2\} in all, and this run's own Ray on "
                                           r"this machine has \{'gen': 0\}; no node joins it"):
            launcher.start(worker_spec(plan, tmp_path / "plan.json", "rollout", 0, 0, None, tmp_path / "log"))
        spec = worker_spec(plan, tmp_path / "plan.json", "actor", 0, 0, None, tmp_path / "log")
        with pytest.raises(RunError, match=r"pool 'actor' needs \{'GPU': 1\} in all.*has \{'GPU': 0\}"):
            launcher.start(dataclasses.replace(spec, gpus=1))
    finally:
        ray.shutdown()


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_a_run_without_an_address_starts_its_own_ray_beside_a_cluster_left_running():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    other = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        RayLauncher(ClusterConfig(backend="ray"))
        try:
            assert ray.get_runtime_context().gcs_address != other.address  # not the cluster it found
        finally:
            ray.shutdown()
    finally:
        other.shutdown()


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_ray_backend_trains_every_sample_exactly_once(tmp_path, local_ray):
    controller = _controller(tmp_path, "cluster.backend=ray", "transport.kind=tcp", "steps=3", "batch_size=2",
                             "group_size=3", "placement={\"rollout\": 2}")
    state = controller.run()

    records = [json.loads(line) for line in (Path(controller.plan.run_dir) / "trained.jsonl").read_text().splitlines()]
    ids = [sid for r in records for sid in r["sample_ids"]]
    assert state.version == 3
    assert sorted(ids) == list(range(3 * 2 * 3)) and len(ids) == len(set(ids))
    node = local_ray.util.get_node_ip_address()
    assert sorted(controller.workers) == ["actor[0]", "rollout[0]", "rollout[1]"]  # advantage runs in rollout
    for w in controller.workers.values():
        assert isinstance(w.process, RayHandle) and w.process.node == node
        assert w.process.poll() is not None, w.worker_id
        assert exits_within(w.process.pid, 10.0), w.worker_id  # the actor's process ends, not idling in Ray
    assert os.getpid() not in {w.process.pid for w in controller.workers.values()}
    groups = local_ray.util.placement_group_table().values()
    assert groups and all(g["state"] == "REMOVED" for g in groups)
    busy = next(row for label, row in zip(*(c.cells for c in live_table(controller).columns)) if label == "busy")
    assert f"rollout[1]@{node} " in busy  # the live view says where each worker runs


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_a_ray_worker_killed_mid_run_binds_anew_and_its_neighbours_are_rewired(tmp_path, local_ray, monkeypatch):
    monkeypatch.setenv("FAKE_ADVANTAGE_POOL", "1")  # advantage in its own pool: a rollout before it, a trainer after
    monkeypatch.setenv("FAKE_STEP_WORK", "40")
    killed: list[str] = []

    def kill_advantage(controller) -> None:
        worker = controller.workers["advantage[0]"]
        if not killed and controller.state.version >= 2 and worker.ready and worker.process.poll() is None:
            killed.append(controller.wiring.listening[("advantage[0]", "rollout")])
            os.kill(worker.process.pid, signal.SIGKILL)

    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    controller = build_controller(recipe, ["cluster.backend=ray", "steps=6", "batch_size=2", "group_size=3"],
                                  tmp_path / "run", on_event=kill_advantage)
    state = controller.run()
    # the new process bound its own port
    assert killed and controller.wiring.listening[("advantage[0]", "rollout")] != killed[0]
    assert all(e.startswith("tcp://127.0.0.1:") for e in controller.wiring.listening.values())
    records = [json.loads(line) for line in (Path(controller.plan.run_dir) / "trained.jsonl").read_text().splitlines()]
    ids = [sid for r in records for sid in r["sample_ids"]]
    assert state.version == 6 and sorted(ids) == list(range(6 * 2 * 3))  # none lost, none twice

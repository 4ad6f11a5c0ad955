"""Real runs on a simulated Ray cluster of several nodes (ray.cluster_utils.Cluster, every node on 127.0.0.1):
pools pinned to nodes by custom resources, weights fetched over TCP by nodes that do not share the run directory,
their records, spans and logs in the run directory, a lost generator node waited for and replaced, a lost trainer
node stopped with a checkpoint and resumed on another cluster shape. Exactly once is checked by sample id from the
per-sample records the run wrote, not from the controller's own counts.

The head node (the controller's, as on a real cluster) has no CPUs, so every worker runs on another node; with
cluster.shared_dir=false each such worker works in its node's copy of the run directory (here under tmp_path).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from areal.cli.run import build_controller
from areal.errors import RunError
from areal.runtime.records.trace import write_trace
from areal.runtime.storage.resume import resume_point

pytestmark = pytest.mark.cluster
RECIPES = Path(__file__).resolve().parents[2] / "recipes"
B, G = 2, 2
# a generator on each "gen" node, the reward and the trainer on the "train" node
PINNED = ["cluster.backend=ray", 'placement={"rollout": 2}', 'cluster.strategies={"rollout": "STRICT_SPREAD"}',
          'cluster.resources={"rollout": {"gen": 1}, "score": {"train": 1}, "actor": {"train": 1}}']
EMULATED = [f"batch_size={B}", f"group_size={G}", "emulation.time_scale=0.05", "emulation.output_tokens_median=48",
            "generation.max_new_tokens=128", "generation.max_batch=32"]
CODE = [f"batch_size={B}", f"group_size={G}", "generation.max_new_tokens=16", "eval.tasks=0",
        "checkpoint.interval_steps=0"]
NODE_S = 60  # how long a node may take to join on two loaded cores


def _gen_node(sim):
    return sim.add_node(num_cpus=2, resources={"gen": 2}, node_ip_address="127.0.0.1")


@pytest.fixture
def cluster(monkeypatch, tmp_path):
    """A head (the controller's node, no CPUs), two nodes with the custom resource "gen" and one with "train"."""
    ray = pytest.importorskip("ray")
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    # Ray then names every node 127.0.0.1: here (read at import) and in the processes it starts (from the environment)
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    sim = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                        "node_ip_address": "127.0.0.1"})
    try:
        gens = [_gen_node(sim), _gen_node(sim)]
        train = sim.add_node(num_cpus=2, resources={"train": 2}, node_ip_address="127.0.0.1")
        ray.init(address=sim.address, log_to_driver=False)
        yield SimpleNamespace(sim=sim, ray=ray, gens=gens, train=train,
                              scratch=["cluster.shared_dir=false", f"cluster.scratch_dir={tmp_path / 'scratch'}"])
    finally:
        ray.shutdown()
        sim.shutdown()


def _trained_lines(run: Path) -> Counter[int]:
    """How many times the run's records say each sample was trained."""
    return Counter(line["sample_id"] for path in (run / "samples").glob("*.jsonl")
                   for line in map(json.loads, path.read_text().splitlines()) if line.get("status") == "trained")


def _generated_lines(run: Path) -> Counter[int]:
    """How many times the run's records say each sample was generated (by any replica of the rollout)."""
    return Counter(line["sample_id"] for path in (run / "samples").glob("rollout-*.jsonl")
                   for line in map(json.loads, path.read_text().splitlines()) if "outputs" in line)


def _steps(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r.get("kind") == "step"]


def _loaded_versions(run: Path, worker: str) -> list[int]:
    lines = map(json.loads, (run / "spans" / f"{worker}.jsonl").read_text().splitlines())
    return [span["args"]["version"] for span in lines if span["name"] == "load weights"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("recipe, settings", [("emulated_rl.py", EMULATED),
                                              pytest.param("code_rl.py", CODE, marks=pytest.mark.slow)])
def test_three_nodes_train_once_by_sample_id_with_weights_over_tcp_and_every_file_in_the_run_directory(
        tmp_path, cluster, recipe, settings):
    run = tmp_path / "run"
    controller = build_controller(RECIPES / recipe, [*settings, *PINNED, *cluster.scratch, "steps=3"], run)
    state = controller.run()

    assert state.version == 3
    assert _trained_lines(run) == Counter(range(3 * B * G))  # every sample once, from the records alone
    hosts = {w: controller.workers[w].process.host for w in ("rollout[0]", "rollout[1]", "score[0]", "actor[0]")}
    assert {hosts["rollout[0]"], hosts["rollout[1]"]} == {n.node_id for n in cluster.gens}
    assert hosts["score[0]"] == hosts["actor[0]"] == cluster.train.node_id
    # weights: fetched over TCP (no run directory on those nodes), loaded by both generators
    assert json.loads((run / "plan.json").read_text())["weights_transport"] == "tcp"
    assert not list((run / "weights").rglob("*.safetensors"))
    assert all(max(_loaded_versions(run, f"rollout-{r}")) >= 2 for r in (0, 1))
    # the bytes the trainer sent them, in its step records: whole versions (8 bytes each: the emulated trainer's
    # step counter), never more than the generators' loads took
    if recipe == "emulated_rl.py":
        sent = [round(s["weights_sent_mib"] * 2**20) for s in _steps(run)]
        loads = sum(len(_loaded_versions(run, f"rollout-{r}")) for r in (0, 1))
        assert sent == sorted(sent) and 0 < sent[-1] <= 8 * loads and sent[-1] % 8 == 0
    # records, spans and logs of every worker reached the run directory from the nodes' copies
    workers = ["rollout-0", "rollout-1", "score-0", "actor-0"]
    assert {p.stem for p in (run / "samples").glob("*.jsonl")} == {*workers, "controller"}
    assert {p.stem for p in (run / "spans").glob("*.jsonl")} >= set(workers)
    assert all((run / "logs" / f"{w}.log").is_file() for w in workers)  # a healthy worker writes little there
    copies = sorted(p.name for p in (tmp_path / "scratch").iterdir())
    assert copies == sorted(f"run-{n.node_id[:12]}" for n in [*cluster.gens, cluster.train])
    processes, spans = write_trace(run, tmp_path / "trace.json")
    assert processes == 4 and spans > 0  # areal trace shows the whole cluster


# the node is lost at version 2 and its replacement takes seconds to start on Ray: the run must still have groups
# to generate by then. At the other tests' speed-up (time_scale 0.05) the nine steps after the replacement joined
# took under a second, and a CI run on a slow host ended with it having reported no sample (at 8 steps, then at
# 12); at three times the modelled devices' time they take about 10 s
LOST_NODE_RUN_STEPS = 12
LOST_NODE_TIME_SCALE = "emulation.time_scale=3.0"


@pytest.mark.timeout(600)
def test_a_lost_generator_node_is_waited_for_said_so_and_its_replacement_used(tmp_path, cluster):
    """The node with a rollout and a score replica goes at once: the replicas wait for room, the run says what for,
    the node that joins later takes both, the groups they held or were dealt meanwhile are generated again, and
    every sample is trained once by the records."""
    events: dict[str, str] = {}

    def lose_and_replace(controller) -> None:  # in the controller's loop: Ray starts nodes from the main thread
        if "lost" not in events and controller.state.version >= 2:
            lost = cluster.gens[1]
            events["lost"] = lost.node_id
            events["replicas"] = ",".join(sorted(w.worker_id for w in controller.workers.values()
                                                 if w.process.host == lost.node_id))
            cluster.sim.remove_node(lost)
        elif "lost" in events and "new" not in events and any(w.noted_wait for w in controller.workers.values()):
            events["new"] = _gen_node(cluster.sim).node_id

    run = tmp_path / "run"
    settings = [*EMULATED, LOST_NODE_TIME_SCALE, *PINNED, 'placement={"rollout": 2, "score": 2}',  # a later --set wins
                'cluster.resources={"rollout": {"gen": 1}, "score": {"gen": 1}, "actor": {"train": 1}}',
                'cluster.strategies={"rollout": "STRICT_SPREAD", "score": "STRICT_SPREAD"}',
                f"steps={LOST_NODE_RUN_STEPS}"]
    controller = build_controller(RECIPES / "emulated_rl.py", settings, run, on_event=lose_and_replace)
    state = controller.run()

    assert state.version == LOST_NODE_RUN_STEPS
    lost = events["replicas"].split(",")
    assert len(lost) == 2 and {w.split("[")[0] for w in lost} == {"rollout", "score"}  # one of each went
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {m["worker"] for m in metrics if m.get("kind") == "restart"} == set(lost)
    waits = [m["why"] for m in metrics if m.get("kind") == "waiting"]
    assert waits and all("needs {'CPU': 1, 'gen': 1}" in why and "when a node with room for it joins" in why
                         for why in waits)
    assert all(controller.workers[w].process.host == events["new"] for w in lost)  # the node that joined
    assert controller.workers[next(w for w in lost if w.startswith("rollout"))].counts["samples"] > 0  # it worked
    assert _trained_lines(run) == Counter(range(LOST_NODE_RUN_STEPS * B * G))
    again = {sid for sid, n in _generated_lines(run).items() if n > 1}  # a re-issued group writes its lines again
    assert again and controller.accounting.reissued >= len(again) // G


# It failed intermittently (2026-11-30: two CI runs of two, a trainer actor ending early, once before the node is
# taken and once in the resumed run) and was left out of CI for a stop. Two causes found and fixed: two actors on
# one node wrote the run's inputs into its copy in place, so one could read the plan empty or the other's unmodified
# one (test_ray_copy.py), and a connection blip (Ray's ActorUnavailableError) was taken for the actor's death
# (test_ray_handle.py). Then 11 of 11 runs passed, 5 of them beside a busy process.
@pytest.mark.timeout(600)
def test_the_trainers_node_lost_stops_with_a_checkpoint_that_resumes_on_another_cluster_shape(tmp_path, cluster,
                                                                                              caplog):
    def lose_trainer(controller) -> None:
        if controller.state.version >= 4 and cluster.train in cluster.sim.worker_nodes:
            cluster.sim.remove_node(cluster.train)

    run = tmp_path / "run"
    settings = [*EMULATED, *PINNED, *cluster.scratch, "steps=8", "checkpoint.interval_steps=2"]
    controller = build_controller(RECIPES / "emulated_rl.py", settings, run, on_event=lose_trainer)
    with pytest.raises(RunError, match=r"(?s)worker actor\[0\] exited.*the trainer holds the optimizer state: "
                                       rf"continue with `areal run --resume {run}`"):
        controller.run()
    # the generators stopped when told, none killed: one waiting for a version from the lost trainer gives it up
    assert not [r for r in caplog.records if r.getMessage().startswith("killing rollout")]
    point = resume_point(run)
    assert point.checkpoint is not None and int(point.checkpoint.name.removeprefix("step-")) >= 2
    first = _trained_lines(run)

    # the new shape: one node for both generators (no longer spread), one for the reward and the trainer
    cluster.ray.shutdown()
    for node in list(cluster.sim.worker_nodes):
        cluster.sim.remove_node(node)
    cluster.sim.add_node(num_cpus=3, resources={"gen": 2}, node_ip_address="127.0.0.1")
    cluster.sim.add_node(num_cpus=2, resources={"train": 2}, node_ip_address="127.0.0.1")
    cluster.ray.init(address=cluster.sim.address, log_to_driver=False)
    resumed = build_controller(point.recipe, [*point.overrides, 'cluster.strategies={"rollout": "PACK"}'], run, point)
    state = resumed.run()

    assert state.version == 8
    trained = _trained_lines(run)
    assert set(trained) == set(range(8 * B * G))
    # trained twice only where the first run trained past its last checkpoint (rolled back, trained again)
    assert {sid for sid, n in trained.items() if n > 1} <= set(first)

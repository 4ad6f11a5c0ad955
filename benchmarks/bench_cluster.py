"""Past one machine, on a simulated Ray cluster (ray.cluster_utils.Cluster: every node a set of Ray processes on
this machine, named 127.0.0.1, so the runs share its cores and differ only in where Ray puts each pool).

    python benchmarks/bench_cluster.py                         # every table
    python benchmarks/bench_cluster.py --tables nodes --steps 6

- **nodes**: the emulated recipe with two generators, on one worker node and on three (a generator on each of
  two, the reward and the trainer on the third, as tests/runtime/test_cluster.py pins them), at equal
  generators and batch: trained samples/s, and against the zero-overhead model of the same run
  (benchmarks/scale_model.py, as bench_scale.py's scaling table).
- **lost**: the three-node run losing the node of one generator and one reward replica at version 2, a node
  added back when the run says what its replicas wait for: seconds from the loss to the run's next step, to the
  run saying so, and to the replaced generator's first sample, and the steps trained meanwhile.
- **bytes**: the code recipe (the tiny coder) on three nodes, one run per transport that crosses hosts: the size
  of a version, the versions after v0 the generators on other nodes loaded (their spans), and the bytes moved
  across hosts per version: counted by the trainer for tcp (`weights_sent_mib`), the version's size times the
  remote followers for files (each reads the whole file from the shared run directory) and broadcast (gloo's
  bytes are not counted here).

The head node has no CPUs (the controller's, as on a real cluster); every worker runs on another node.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import bench_scale

ROOT = Path(__file__).resolve().parents[1]
GENERATORS = 2
THREE_NODES = [(2, {"gen": 2}), (2, {"gen": 2}), (2, {"train": 2})]  # (CPUs, custom resources) of each node
ONE_NODE = [(6, {"gen": GENERATORS, "train": 2})]  # as many CPUs, and both kinds of room, on one node
SPREAD = ['cluster.strategies={"rollout": "STRICT_SPREAD"}']
PINNED = ["cluster.backend=ray", f'placement={{"rollout": {GENERATORS}}}',
          'cluster.resources={"rollout": {"gen": 1}, "score": {"train": 1}, "actor": {"train": 1}}']
CODE = ["batch_size=2", "group_size=2", "generation.max_new_tokens=16", "eval.tasks=0", "checkpoint.interval_steps=0"]


@contextmanager
def simulated(nodes: list[tuple[int, dict[str, float]]]) -> Iterator[tuple[Any, list[Any]]]:
    """A head with no CPUs and one worker node per entry of `nodes` (its CPUs and custom resources), on
    127.0.0.1, with this process connected to it: the cluster, and its worker nodes in `nodes`' order."""
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    ray_constants.ENABLE_RAY_CLUSTER = False  # every node named 127.0.0.1: here (read at import) and in the
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # processes Ray starts (from the environment)
    sim = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                        "node_ip_address": "127.0.0.1"})
    try:
        added = [add_node(sim, *node) for node in nodes]
        ray.init(address=sim.address, log_to_driver=False)
        yield sim, added
    finally:
        ray.shutdown()
        sim.shutdown()


def add_node(sim: Any, cpus: int, resources: dict[str, float]) -> Any:
    return sim.add_node(num_cpus=cpus, resources=resources, node_ip_address="127.0.0.1")


def emulated(args: argparse.Namespace) -> list[str]:
    """bench_scale's weak-scaling run at two generators, on Ray."""
    scale = SimpleNamespace(steps=args.steps, time_scale=args.time_scale, median=args.median, set=args.set,
                            scaling_time_scale=args.time_scale, sigma=args.sigma)
    return [*bench_scale.weak_scaling(scale, GENERATORS), *PINNED]


def nodes(args: argparse.Namespace, tmp: Path) -> list[str]:
    overrides = emulated(args)
    modelled = bench_scale.modelled_rate(overrides, generators=GENERATORS)
    layouts = {"1 node": (ONE_NODE, []), "3 nodes": (THREE_NODES, SPREAD)}
    lines = [f"{'layout':<8} {'generators':>10} {'samples/s':>10} {'model':>8} {'of model':>9} {'wall s':>8}"]
    for name, (shape, extra) in layouts.items():
        with simulated(shape):
            result = bench_scale.run([*overrides, *extra], tmp / name.replace(" ", "-"))
        rate = result["samples_per_s"]
        lines.append(f"{name:<8} {GENERATORS:>10} {rate:>10.2f} {modelled:>8.2f} {rate / modelled:>8.0%} "
                     f"{result['wall_s']:>8.1f}")
    return lines


def lost(args: argparse.Namespace, tmp: Path) -> list[str]:
    from areal.cli.run import build_controller

    marks: dict[str, Any] = {}
    with simulated(THREE_NODES) as (sim, added):
        def lose_and_replace(controller: Any) -> None:  # in the controller's loop: Ray adds nodes from here
            now = time.monotonic()
            if "lost" not in marks and controller.state.version >= 2:
                node = added[1]
                marks.update(lost=now, at=controller.state.version, replicas=[
                    w.worker_id for w in controller.workers.values() if w.process.host == node.node_id])
                sim.remove_node(node)
            elif "lost" in marks:
                if "step" not in marks and controller.state.version > marks["at"]:
                    marks["step"] = now
                if "said" not in marks and any(w.noted_wait for w in controller.workers.values()):
                    marks["said"] = now
                    marks["new"] = add_node(sim, *THREE_NODES[1]).node_id
                replaced = [controller.workers[w] for w in marks["replicas"] if w.startswith("rollout")]
                if "new" in marks and "sample" not in marks and all(
                        w.process.host == marks["new"] and w.counts.get("samples", 0) > 0 for w in replaced):
                    marks["sample"] = now
                    marks["meanwhile"] = controller.state.version - marks["at"]  # steps with one generator fewer

        settings = [*emulated(args), f"steps={max(args.steps, 8)}",
                    f'placement={{"rollout": {GENERATORS}, "score": 2}}',
                    'cluster.resources={"rollout": {"gen": 1}, "score": {"gen": 1}, "actor": {"train": 1}}',
                    'cluster.strategies={"rollout": "STRICT_SPREAD", "score": "STRICT_SPREAD"}']
        build_controller(bench_scale.RECIPE, settings, tmp / "lost", on_event=lose_and_replace).run()

    def since(mark: str) -> str:
        return f"{marks[mark] - marks['lost']:.1f}" if mark in marks else "never"

    return [f"lost {', '.join(marks['replicas'])} at version {marks['at']}: next step after {since('step')} s, "
            f"the run said what they wait for after {since('said')} s (a node was added then), the replaced "
            f"generator's first sample after {since('sample')} s; {marks.get('meanwhile', '?')} steps trained "
            f"meanwhile"]


def bytes_moved(args: argparse.Namespace, tmp: Path) -> list[str]:
    from areal.cli.run import build_controller

    routes = {"files": [], "broadcast": [], "tcp": ["cluster.shared_dir=false",
                                                    f"cluster.scratch_dir={tmp / 'scratch'}"]}
    lines = [f"{'transport':<10} {'version MiB':>12} {'remote followers':>17} {'their loads of v1+':>19} "
             f"{'MiB / version':>14}  how"]
    for kind, extra in routes.items():
        run_dir = tmp / f"bytes-{kind}"
        with simulated(THREE_NODES):
            controller = build_controller(ROOT / "recipes" / "code_rl.py",
                                          [*CODE, *PINNED, *SPREAD, f"steps={args.steps}",
                                           f"transport.weights={kind}", *extra], run_dir)
            controller.run()
            trainer_host = controller.workers["actor[0]"].process.host
            remote = [w.worker_id.replace("[", "-").rstrip("]") for w in controller.workers.values()
                      if w.pool == "rollout" and w.process.host != trainer_host]
        steps = [r for r in _lines(run_dir / "metrics.jsonl") if r.get("kind") == "step"]
        loads = sum(v >= 1 for w in remote for v in _loaded(run_dir / "spans" / f"{w}.jsonl"))
        size = _version_mib(run_dir)
        if kind == "tcp":  # read as the last version is published: every earlier one has been fetched by then
            per_version, how = steps[-1]["weights_sent_mib"] / (len(steps) - 1), "counted by the trainer"
        else:
            per_version, how = size * len(remote), "version size x remote followers"
        lines.append(f"{kind:<10} {size:>12.2f} {len(remote):>17} {loads:>19} {per_version:>14.2f}  {how}")
    return lines


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _loaded(spans: Path) -> list[int]:
    return [s["args"]["version"] for s in _lines(spans) if s["name"] == "load weights"]


def _version_mib(run_dir: Path) -> float:
    """The size of one version of the policy: its tensors in the run's sealed checkpoint (or a published file)."""
    files = sorted(run_dir.glob("checkpoints/*/policy-*.safetensors")) or sorted(
        run_dir.glob("weights/*/v*.safetensors"))
    return files[-1].stat().st_size / 2**20


TABLES: dict[str, Callable[[argparse.Namespace, Path], list[str]]] = {"nodes": nodes, "lost": lost,
                                                                        "bytes": bytes_moved}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", nargs="+", choices=list(TABLES), default=list(TABLES))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--time-scale", type=float, default=0.05, help="real seconds per modelled second")
    parser.add_argument("--median", type=int, default=256, help="median output tokens")
    parser.add_argument("--sigma", type=float, default=0.6, help="σ of the log-normal output lengths")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_cluster-") as tmp:
        for name in args.tables:
            print(f"== {name}", flush=True)
            print("\n".join(TABLES[name](args, Path(tmp))), flush=True)


if __name__ == "__main__":
    sys.exit(main())

"""Publishing a policy and loading it into a follower's model: files vs shared memory vs broadcast (gloo here) vs
tcp (ZeroMQ, the follower fetching from the trainer).

    python benchmarks/bench_weights.py                   # the built-in tiny model and a Qwen2-0.5B-shaped one
    python benchmarks/bench_weights.py --models tiny     # a quick run

Each route is the runtime's own transport (areal/runtime/weights/: `TRANSPORTS[kind]`), the trainer's
publisher in one process and a follower in another, as in a run:
- files: the trainer writes vNNNNNN.safetensors (temp file, then rename) and the follower reads it;
- shm: the trainer writes the tensors once into a shared-memory segment and the follower maps it;
- broadcast: the trainer sends the tensors over the weights group (gloo on CPU) and the follower receives them;
- tcp: the trainer keeps the tensors in memory and the follower fetches them over a CURVE-armed ZeroMQ socket, as a
  run does across machines (the choice between ZeroMQ and gloo for weights without a shared disk rests on this row).
A round is timed from the trainer starting to publish to the follower's model holding the new weights
(`load_state_dict`); "publish" is the trainer's part (written and, for a broadcast, sent), "load" the
follower's. Best of ROUNDS after one untimed round (a broadcast's first carries the layout). The 0.5B
model is Qwen2-0.5B's shape (24 layers, width 896, vocabulary 151,936, tied embeddings) with random weights
in bfloat16, so every copy of it is ~1 GB and a run stays under 8 GB. On GPU the group is NCCL between
devices, not measured here.
"""

from __future__ import annotations

import argparse
import socket
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.multiprocessing as mp

from areal.runtime.weights import TRANSPORTS, WeightUpdate, arm, receive
from areal.runtime.weights.transport import Source
from areal.runtime.wire.security import RunKey

ROUNDS = 3
ROUTES = ("files", "shm", "broadcast", "tcp")


def make_model(name: str) -> torch.nn.Module:
    """The model a route moves: random weights, the same in every process (seeded)."""
    torch.manual_seed(0)
    if name == "tiny":
        from areal.models.loading import load_policy

        return load_policy("builtin:tiny-coder")[0]
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
    return Qwen2ForCausalLM(config).to(torch.bfloat16).eval()


class _Follower:
    """A follower's model, as the generate node holds it: the transport hands it the tensors (or the group's)."""

    def __init__(self, model: torch.nn.Module, group: Any = None) -> None:
        self.model, self.group = model, group

    def load_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        with torch.no_grad():
            self.model.load_state_dict(weights)

    def receive_weights(self, version: int) -> None:
        self.load_weights(self.group.receive(), version)


def _plan(run_dir: str, port: int) -> Any:
    members = {"trainer[0]": 0, "rollout[0]": 1}
    return SimpleNamespace(run_dir=run_dir, weights_dir=str(Path(run_dir) / "weights"), policy="actor",
                           weights_rendezvous=f"127.0.0.1:{port}", weights_members=lambda: members)


def _trainer(route: str, model_name: str, run_dir: str, port: int, told: Any, loaded: Any, out: Any,
             key: tuple[bytes, bytes]) -> None:
    torch.set_num_threads(1)
    arm(RunKey(*key))  # tcp: the run's key, as every TCP socket of a run has
    state = make_model(model_name).state_dict()
    config = SimpleNamespace(sampling_lag=0, generation=SimpleNamespace(engine="torch"),
                             transport=SimpleNamespace(weights=route, host="127.0.0.1"))
    source = Source(model="actor", plan=_plan(run_dir, port), config=config, rank_follower=False,
                    gather=lambda: state, save=lambda path: _save(state, path))
    out.put(publish_rounds(TRANSPORTS[route].publisher(source), told, loaded))


def publish_rounds(publisher: Any, told: Any, loaded: Any) -> list[tuple[float, float, float]]:
    """Publish ROUNDS + 1 versions, each once the follower holds the last; (publish, load, total) s of each but
    the first (a broadcast's first carries the layout). The publisher is made first: a broadcast's group forms
    there, with its first send."""
    rows = []
    try:
        for version in range(1, ROUNDS + 2):
            start = time.perf_counter()
            via = publisher.publish(version)
            told.put(WeightUpdate("actor", version, via))  # the controller tells the follower
            publisher.reported()
            published = time.perf_counter()
            load_s = loaded.get()
            rows.append((published - start, load_s, time.perf_counter() - start))
    finally:
        publisher.close()
    return rows[1:]


def _save(state: dict[str, torch.Tensor], path: str | None) -> None:
    from areal.nodes.workers.policy import save_weights

    if path is not None:  # None: a rank's part of gathering, which one process has not
        save_weights(state, path)


def _follower(route: str, model_name: str, port: int, told: Any, loaded: Any, key: tuple[bytes, bytes]) -> None:
    torch.set_num_threads(1)
    arm(RunKey(*key))
    follow_rounds(_Follower(make_model(model_name)), route, port, told, loaded)


def follow_rounds(follower: Any, route: str, port: int, told: Any, loaded: Any) -> None:
    """Load each of the ROUNDS + 1 versions the trainer tells of, reporting the seconds each took; a broadcast's
    follower first joins the weights group and takes the weights the trainer starts from."""
    if route == "broadcast":
        from areal.engines.weight_group import WeightGroup

        follower.group = WeightGroup(f"127.0.0.1:{port}", 1, 2)
        follower.receive_weights(0)
    for _ in range(ROUNDS + 1):
        update = told.get()
        start = time.perf_counter()
        receive(update, follower)
        loaded.put(time.perf_counter() - start)


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on now (the weights group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def time_route(route: str, model_name: str, run_dir: Path) -> tuple[float, float, float]:
    """(publish s, load s, total s), each the best of ROUNDS."""
    port = free_port()
    ctx = mp.get_context("spawn")
    told, loaded, out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    made = RunKey.create()
    key = (made.public, made.secret)
    follower = ctx.Process(target=_follower, args=(route, model_name, port, told, loaded, key))
    follower.start()
    trainer = ctx.Process(target=_trainer, args=(route, model_name, str(run_dir), port, told, loaded, out, key))
    trainer.start()
    try:
        rows = out.get(timeout=1800)
    finally:
        trainer.join(60)
        follower.join(60)
    return min(r[0] for r in rows), min(r[1] for r in rows), min(r[2] for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny", "qwen2-0.5b"], choices=["tiny", "qwen2-0.5b"])
    parser.add_argument("--routes", nargs="+", default=list(ROUTES), choices=ROUTES)
    args = parser.parse_args()
    print(f"best of {ROUNDS} publishes, one follower; seconds from the trainer starting to publish to the "
          "follower's model holding the weights")
    print(f"{'model':>11} {'params':>12} {'MiB':>6} {'route':>10} {'publish s':>10} {'load s':>8} {'total s':>8} "
          f"{args.routes[0] + ' / route':>14}")
    for name in args.models:
        state = make_model(name).state_dict()
        params = sum(t.numel() for t in state.values())
        mib = sum(t.numel() * t.element_size() for t in state.values()) / 2**20
        del state
        totals = {}
        for route in args.routes:
            with tempfile.TemporaryDirectory(prefix="areal-bench-weights-") as tmp:
                publish, load, total = time_route(route, name, Path(tmp))
            totals[route] = total
            print(f"{name:>11} {params:>12,} {mib:>6.0f} {route:>10} {publish:>10.3f} {load:>8.3f} {total:>8.3f} "
                  f"{totals[args.routes[0]] / total:>13.2f}x", flush=True)


if __name__ == "__main__":
    main()

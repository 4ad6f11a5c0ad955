"""GPU suite, weights: publishing the 0.5B policy from a trainer process to a generator process that holds the
same model on the same GPU, by each route a run can take:

- files (transport.weights=files): the trainer writes v{n}.safetensors (a temp file, then a rename), the generator
  reads it and loads it into its model;
- broadcast over gloo (transport.weights=broadcast with the torch engine): the trainer's tensors are staged on the
  CPU and broadcast over the weights group, and the generator loads what it received into its model;
- broadcast over NCCL (the vLLM route): GPU to GPU. NCCL refuses two ranks on one GPU, so on a one-GPU machine
  this row records that refusal.

Each route is timed from the moment the trainer starts publishing to the moment the generator's model holds the
new weights (best of the rounds; a group's first publish also carries the layout and is not timed), and the
trainer's own blocked time beside it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from areal.engines.weight_group import WeightGroup
from areal.nodes.workers.policy import load_weights, save_weights
from benchmarks.gpu.model import Shape, build, peak_gib, reset_peak, shape_facts
from benchmarks.gpu.section import section_main

ROUTES = ("files", "broadcast-gloo", "broadcast-nccl")
FOLLOWER_TIMEOUT_S = 120.0


def rounds(tiny: bool) -> int:
    return 2 if tiny else 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _follow(route: str, where: str, model_shape: Shape, device: str, dtype: torch.dtype, n_rounds: int,
            published: Any, started: Any, done: Any) -> None:
    """The generator's side: a model on the device, then each round's weights loaded into it; `done` gets the
    seconds from the trainer's start to the load's end (both processes read the same monotonic clock), or the
    error that stopped it."""
    try:
        model = build(model_shape, torch.device(device), dtype)
        group = None
        if route != "files":
            group = WeightGroup(where, 1, 2, device="cuda" if route == "broadcast-nccl" else "cpu")
            model.load_state_dict(group.receive())  # the layout round
        for _ in range(n_rounds):
            if group is None:
                published.wait()
                published.clear()
                state = load_weights(where)
            else:
                state = group.receive()
            model.load_state_dict(state)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            done.put(time.perf_counter() - started.value)
    except Exception as err:
        done.put(f"{type(err).__name__}: {str(err)[:400]}")


def _publish_all(route: str, where: str, state: dict[str, torch.Tensor], n_rounds: int, published: Any,
                 started: Any, trainer_s: list[float], loaded: threading.Semaphore) -> None:
    """The trainer's side, in a thread: a collective the generator never joins blocks it, and the section must
    still report. Each round starts once the generator has loaded the last (`loaded`)."""
    group = None
    if route != "files":
        group = WeightGroup(where, 0, 2, device="cuda" if route == "broadcast-nccl" else "cpu")
        group.send(state)  # the layout round: not timed
    for _ in range(n_rounds):
        loaded.acquire()
        started.value = time.perf_counter()
        if group is None:
            tmp = Path(where).with_suffix(".tmp")
            save_weights(state, str(tmp))
            os.replace(tmp, where)
            published.set()
        else:
            group.send(state)
        trainer_s.append(time.perf_counter() - started.value)


def _latencies(done: Any, n_rounds: int, loaded: threading.Semaphore) -> list[float]:
    out: list[float] = []
    deadline = time.monotonic() + FOLLOWER_TIMEOUT_S
    while len(out) < n_rounds:
        item = done.get(timeout=max(1.0, deadline - time.monotonic()))
        if isinstance(item, str):
            raise RuntimeError(f"the generator's side failed: {item}")
        out.append(float(item))
        loaded.release()
    return out


def measure_route(route: str, device: torch.device, model_shape: Shape, tiny: bool,
                  state: dict[str, torch.Tensor], folder: Path) -> dict:
    ctx = mp.get_context("spawn")
    published, done, started = ctx.Event(), ctx.Queue(), ctx.Value("d", 0.0)
    where = str(folder / "v000001.safetensors") if route == "files" else f"127.0.0.1:{_free_port()}"
    dtype = next(iter(state.values())).dtype
    follower = ctx.Process(target=_follow, args=(route, where, model_shape, str(device), dtype, rounds(tiny),
                                                 published, started, done), daemon=True)
    follower.start()
    trainer_s: list[float] = []
    loaded = threading.Semaphore(1)
    publisher = threading.Thread(target=_publish_all, args=(route, where, state, rounds(tiny), published, started,
                                                            trainer_s, loaded), daemon=True)
    publisher.start()
    try:
        latency_s = _latencies(done, rounds(tiny), loaded)
        publisher.join(FOLLOWER_TIMEOUT_S)
        return {"latency_s": min(latency_s), "trainer_blocked_s": min(trainer_s)}
    finally:
        follower.join(10 if publisher.is_alive() else FOLLOWER_TIMEOUT_S)
        if follower.is_alive():
            follower.kill()
            follower.join()


def measure(device: torch.device, model_shape: Shape, tiny: bool, variant: str = "") -> dict:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build(model_shape, device, dtype)
    state = model.state_dict()
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    rows: dict[str, dict] = {}
    routes = ROUTES if device.type == "cuda" else ROUTES[:2]  # NCCL needs a GPU
    with tempfile.TemporaryDirectory(prefix="areal-gpu-weights-") as tmp:
        for route in routes:
            reset_peak(device)
            try:
                row = measure_route(route, device, model_shape, tiny, state, Path(tmp))
                row["gb_per_s"] = nbytes / row["latency_s"] / 1e9
            except Exception as err:  # a route this machine cannot take is a row that says why
                row = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
            row["trainer_peak_gib"] = peak_gib(device)
            rows[route] = row
    return {"model": shape_facts(model_shape), "dtype": str(dtype), "bytes": nbytes, "tensors": len(state),
            "rounds": rounds(tiny), "rows": rows}


if __name__ == "__main__":
    section_main(measure, __doc__)

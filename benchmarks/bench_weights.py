"""Publishing a policy: through a safetensors file vs over the weights group (gloo on CPU here).

    python benchmarks/bench_weights.py                 # 25 M and 100 M float32 parameters
    python benchmarks/bench_weights.py --params 5e6    # a quick run

Files: the trainer writes v{n}.safetensors (temp file, then rename) and a generator reads it.
Broadcast: the trainer sends the same tensors to one generator over `WeightGroup` (the route of
transport.weights=broadcast), timed on the receiving side from the moment the sender starts.
Both sides run in separate processes, as in a run; the state is shaped like a transformer's
(many matrices of a few sizes). On GPU the group is NCCL between devices, not measured here.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from areal.engines.weight_group import WeightGroup

ROUNDS = 3


def make_state(params: int) -> dict[str, torch.Tensor]:
    width = 1024
    layers = max(1, params // (12 * width * width))
    g = torch.Generator().manual_seed(0)
    state = {}
    for i in range(layers):
        state[f"layers.{i}.attn.qkv"] = torch.randn(3 * width, width, generator=g)
        state[f"layers.{i}.attn.out"] = torch.randn(width, width, generator=g)
        state[f"layers.{i}.mlp.up"] = torch.randn(4 * width, width, generator=g)
        state[f"layers.{i}.mlp.down"] = torch.randn(width, 4 * width, generator=g)
        state[f"layers.{i}.norm"] = torch.ones(width)
    return state


def _files_reader(path: str, ready, done) -> None:
    for _ in range(ROUNDS):
        ready.wait()
        ready.clear()
        load_file(path)
        done.set()


def time_files(state: dict[str, torch.Tensor], folder: Path) -> float:
    final, tmp = folder / "v000001.safetensors", folder / ".v000001.tmp"
    ctx = mp.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    reader = ctx.Process(target=_files_reader, args=(str(final), ready, done))
    reader.start()
    times = []
    try:
        for _ in range(ROUNDS):
            start = time.perf_counter()
            save_file(state, str(tmp))
            os.replace(tmp, final)
            ready.set()
            done.wait()
            done.clear()
            times.append(time.perf_counter() - start)
    finally:
        reader.join(60)
    return min(times)


def _member(member: int, port: int, params: int, out: str) -> None:
    group = WeightGroup(f"127.0.0.1:{port}", member, 2)
    state = make_state(params) if member == 0 else None
    times = []
    for _ in range(ROUNDS + 1):  # the first publish also carries the layout: not timed
        start = time.perf_counter()
        if state is not None:
            group.send(state)
        else:
            group.receive()
        times.append(time.perf_counter() - start)
    if member == 1:
        Path(out).write_text(str(min(times[1:])))


def time_broadcast(params: int, folder: Path) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = folder / "broadcast.txt"
    mp.start_processes(_member, args=(port, params, str(out)), nprocs=2, start_method="spawn")
    return float(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=float, nargs="+", default=[25e6, 100e6])
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"best of {ROUNDS} publishes, one reader; seconds from the trainer starting to publish to the reader "
          f"holding the tensors")
    print(f"{'parameters':>12} {'MiB':>8} {'files s':>9} {'broadcast s':>12} {'files / broadcast':>18}")
    for params in (int(p) for p in args.params):
        state = make_state(params)
        mib = sum(t.numel() * t.element_size() for t in state.values()) / 2**20
        with tempfile.TemporaryDirectory(prefix="areal-bench-weights-") as tmp:
            files = time_files(state, Path(tmp))
            broadcast = time_broadcast(params, Path(tmp))
        count = sum(t.numel() for t in state.values())
        print(f"{count:>12,} {mib:>8.0f} {files:>9.3f} {broadcast:>12.3f} {files / broadcast:>17.2f}x")


if __name__ == "__main__":
    main()

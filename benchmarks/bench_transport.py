"""Transport benchmark: batches between two processes over ipc and tcp loopback, vs memcpy.

    python benchmarks/bench_transport.py [--big-messages 200 --small-messages 5000 --repeats 3]

Throughput: the parent sends 4 MB float32 tensors through `BatchSender` to a spawned child
that receives them with `BatchReceiver` (decoded, zero-copy, the data not touched again); the
clock runs from the first send until the child reports that the last one arrived. Baseline: an
in-process copy of the same buffer (`tensor.clone()`, and `copy_` into a preallocated tensor).
Small messages: batches of 8 samples (sample_id, group_id, reward, versions ragged 8x16,
a meta map), encode and decode included. Best of `--repeats`; the machine is shared, so
timings are noisy.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

import torch

from areal.graph.batch import Batch, Ragged
from areal.runtime.wire.channels import BatchReceiver, BatchSender, ipc_endpoint, tcp_endpoint
from areal.runtime.wire.codec import decode, encode

BIG_BYTES = 4 * 2**20
WARMUP = 10


def big_batch() -> Batch:
    return Batch({"logits": torch.rand(1, BIG_BYTES // 4)})


def small_batch() -> Batch:
    return Batch(
        {
            "sample_id": torch.arange(8, dtype=torch.int64),
            "group_id": torch.arange(8, dtype=torch.int64) // 4,
            "reward": torch.rand(8),
            "versions": Ragged.from_rows([torch.full((16,), 3, dtype=torch.int32)] * 8),
        }
    )


SMALL_META = {"sender": "rollout", "replica": 0, "attempt": 0}


def _receive(endpoint: str, conn: Connection, counts: list[int]) -> None:
    """Child: bind, then for each phase receive `count` batches and report."""
    torch.set_num_threads(1)
    with BatchReceiver(endpoint, bind=True) as receiver:
        conn.send(receiver.endpoint)
        for count in counts:
            for _ in range(count):
                if receiver.recv(timeout_ms=60_000) is None:
                    raise TimeoutError(f"{endpoint}: nothing arrived for 60 s")
            conn.send(receiver.rejected)
        conn.recv()  # the parent has every report: close now


def _run_pair(endpoint: str, phases: list[tuple[Batch, dict[str, str], int]]) -> list[float]:
    """Seconds per phase for the parent to push `count` batches that the child all received."""
    parent, child = mp.Pipe()
    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=_receive, args=(endpoint, child, [n for _, _, n in phases]), daemon=True)
    proc.start()
    try:
        if not parent.poll(120):
            raise TimeoutError("the receiving process did not start in 120 s")
        with BatchSender(parent.recv(), bind=False, timeout_ms=60_000) as sender:
            seconds = []
            for batch, meta, count in phases:
                start = time.perf_counter()
                for _ in range(count):
                    sender.send(batch, meta)
                if not parent.poll(120) or parent.recv() != 0:
                    raise RuntimeError("the receiver timed out or rejected a batch")
                seconds.append(time.perf_counter() - start)
            parent.send("done")
        proc.join(30)
        return seconds
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def _best(fn: Callable[[], float], repeats: int) -> float:
    return min(fn() for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--big-messages", type=int, default=200)
    parser.add_argument("--small-messages", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    gb = args.big_messages * BIG_BYTES / 1e9

    big = big_batch()
    src = big["logits"]
    dst = torch.empty_like(src)

    def clone() -> float:
        start = time.perf_counter()
        for _ in range(args.big_messages):
            src.clone()
        return time.perf_counter() - start

    def copy_into() -> float:
        start = time.perf_counter()
        for _ in range(args.big_messages):
            dst.copy_(src)
        return time.perf_counter() - start

    def codec_only() -> float:
        small, start = small_batch(), time.perf_counter()
        for _ in range(args.small_messages):
            decode([bytes(f) for f in encode(small, SMALL_META)], sender="bench")
        return time.perf_counter() - start

    clone_gbs, copy_gbs = gb / _best(clone, args.repeats), gb / _best(copy_into, args.repeats)
    print("transport benchmark (2 processes, spawn; shared 2-core machine: timings are noisy)")
    print(f"4 MB float32 tensors x {args.big_messages}, one way, best of {args.repeats}:")
    print(f"  in-process memcpy, tensor.clone()   {clone_gbs:6.2f} GB/s")
    print(f"  in-process memcpy, copy_ (prealloc) {copy_gbs:6.2f} GB/s")
    small_rates = {"codec encode+decode, in-process": args.small_messages / _best(codec_only, args.repeats)}
    with tempfile.TemporaryDirectory(prefix="areal-bench-") as run_dir:
        for label, endpoint in [("ipc", ipc_endpoint(run_dir, "bench")), ("tcp 127.0.0.1", tcp_endpoint())]:
            phases = [(big, {}, WARMUP)]
            for _ in range(args.repeats):
                phases += [(big, {}, args.big_messages), (small_batch(), SMALL_META, args.small_messages)]
            seconds = _run_pair(endpoint, phases)[1:]
            gbs = gb / min(seconds[0::2])
            print(f"  {label:<35} {gbs:6.2f} GB/s   {gbs / clone_gbs:.2f}x clone()   {gbs / copy_gbs:.2f}x copy_")
            small_rates[label] = args.small_messages / min(seconds[1::2])
    print(
        f"small batches (8 samples: sample_id, group_id, reward, versions ragged 8x16, meta) "
        f"x {args.small_messages}, best of {args.repeats}:"
    )
    for label, rate in small_rates.items():
        print(f"  {label:<35} {rate:8.0f} msg/s")


if __name__ == "__main__":
    main()

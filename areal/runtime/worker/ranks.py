"""The ranks of one data-parallel trainer: rank 0 leads, the others do the same collectives in step.

Only rank 0 has a data endpoint and talks to the controller about versions and checkpoints. Every
step it passes the others an order: "train" with the step's batch, "checkpoint" with a folder, or
"stop". Each rank then runs the same nodes on the same batch, so every collective inside them
(FSDP's gathers, the all-gather of π_prox, the gather of the weights to publish) meets its peers.

An order travels as the codec's frames (msgpack header, raw tensor bytes; never pickle) broadcast
over a gloo group of its own: frame count, frame sizes, then the bytes. gloo works on CPU tensors
whatever the training backend is (NCCL moves only CUDA tensors). A follower waits on the broadcast
for as long as rank 0 waits for data, hence the long timeout; if rank 0 dies, the controller stops
the run and kills the followers.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from areal.graph.batch import Batch
from areal.runtime.wire.codec import decode, encode

ORDERS = ("train", "checkpoint", "stop")
WAIT = timedelta(days=1)  # a follower idles in the broadcast while rank 0 gathers a step


def rank_environment(rendezvous: str, rank: int, world: int) -> None:
    """What `torch.distributed`'s env:// rendezvous reads; set before the trainer node joins the group."""
    host, _, port = rendezvous.rpartition(":")
    os.environ.update(MASTER_ADDR=host, MASTER_PORT=port, RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))


class RankOrders:
    """Rank 0 `send`s orders; every other rank `receive`s them in the same sequence."""

    def __init__(self) -> None:
        if not dist.is_initialized():
            raise RuntimeError("trainer ranks: torch.distributed is not initialised (trainer.engine=fsdp joins it)")
        self.rank = dist.get_rank()
        self.group = dist.new_group(backend="gloo", timeout=WAIT)

    def send(self, order: str, batch: Batch | None = None, **fields: Any) -> None:
        if order not in ORDERS:
            raise ValueError(f"unknown order {order!r}; orders are {', '.join(ORDERS)}")
        frames = encode(batch if batch is not None else Batch({}), {"order": order, "empty": batch is None, **fields})
        sizes = torch.tensor([memoryview(f).nbytes for f in frames], dtype=torch.int64)
        payload = torch.frombuffer(bytearray().join(frames), dtype=torch.uint8)  # one copy of the batch
        dist.broadcast(torch.tensor([len(frames)], dtype=torch.int64), src=0, group=self.group)
        dist.broadcast(sizes, src=0, group=self.group)
        dist.broadcast(payload, src=0, group=self.group)

    def receive(self) -> tuple[str, Batch | None, dict[str, Any]]:
        count = torch.zeros(1, dtype=torch.int64)
        dist.broadcast(count, src=0, group=self.group)
        sizes = torch.zeros(int(count), dtype=torch.int64)
        dist.broadcast(sizes, src=0, group=self.group)
        payload = torch.empty(int(sizes.sum()), dtype=torch.uint8)
        dist.broadcast(payload, src=0, group=self.group)
        array: Any = payload.numpy()  # numpy's stubs predate typing.Buffer
        view = memoryview(array)
        bounds = [0, *torch.cumsum(sizes, 0).tolist()]
        batch, meta = decode([view[a:b] for a, b in zip(bounds, bounds[1:])], sender="trainer rank 0")
        order = meta.pop("order")
        return order, (None if meta.pop("empty") else batch), meta

"""Rank orders between two spawned processes on gloo: what rank 0 sends, rank 1 receives, in order."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from areal.graph.batch import Batch, Ragged
from areal.runtime.ranks import RankOrders, rank_environment

TIMEOUT_S = 60


def _batch() -> Batch:
    return Batch({
        "sample_id": torch.tensor([4, 5]),
        "output_ids": Ragged.from_rows([torch.tensor([1, 2, 3]), torch.tensor([7])]),
        "completion": ["def f(x): return x", "pass"],
    })


def _rank(rank: int, port: int, out: str) -> None:
    rank_environment(f"127.0.0.1:{port}", rank, 2)
    dist.init_process_group("gloo")
    try:
        orders = RankOrders()
        if rank == 0:
            orders.send("train", _batch())
            orders.send("train", None)  # a step whose groups all failed
            orders.send("checkpoint", folder="/runs/x/checkpoints/step-000002")
            orders.send("stop")
            return
        got = []
        while True:
            order, batch, fields = orders.receive()
            got.append({"order": order, "fields": fields, "batch": None if batch is None else {
                "sample_id": batch["sample_id"].tolist(),
                "output_ids": [r.tolist() for r in batch["output_ids"].rows()],
                "completion": batch["completion"]}})
            if order == "stop":
                break
        Path(out).write_text(json.dumps(got))
    finally:
        dist.destroy_process_group()


def test_rank_1_receives_every_order_of_rank_0_in_order_with_its_batch(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "received.json"
    context = mp.start_processes(_rank, args=(port, str(out)), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not context.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks did not finish within {TIMEOUT_S} s")
        got = json.loads(out.read_text())
    finally:
        for p in context.processes:
            if p.is_alive():
                p.kill()
                p.join(10)
    assert got == [
        {"order": "train", "fields": {}, "batch": {"sample_id": [4, 5], "output_ids": [[1, 2, 3], [7]],
                                                    "completion": ["def f(x): return x", "pass"]}},
        {"order": "train", "fields": {}, "batch": None},
        {"order": "checkpoint", "fields": {"folder": "/runs/x/checkpoints/step-000002"}, "batch": None},
        {"order": "stop", "fields": {}, "batch": None},
    ]


def test_an_unknown_order_is_refused_before_anything_is_sent():
    orders = RankOrders.__new__(RankOrders)  # no group needed: the check comes first
    with pytest.raises(ValueError, match="unknown order 'save'; orders are train, checkpoint, stop"):
        orders.send("save")

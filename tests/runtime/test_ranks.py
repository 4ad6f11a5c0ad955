"""Rank orders between two spawned processes on gloo: what rank 0 sends, rank 1 receives, in order."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

from areal.graph.batch import Batch, Ragged
from areal.runtime.worker.ranks import RankOrders, rank_environment
from tests.spawned import free_port, run_spawned

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
            try:
                orders.send("save")
            except ValueError as err:  # refused before any broadcast: rank 1 must not see it
                Path(out).with_suffix(".refused").write_text(str(err))
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


def test_rank_1_receives_every_order_of_rank_0_in_order_with_its_batch_and_no_refused_one(tmp_path):
    out = tmp_path / "received.json"
    run_spawned(_rank, (free_port(), str(out)), 2, TIMEOUT_S, "trainer ranks")
    assert out.with_suffix(".refused").read_text() == "unknown order 'save'; orders are train, checkpoint, stop"
    got = json.loads(out.read_text())
    assert got == [
        {"order": "train", "fields": {}, "batch": {"sample_id": [4, 5], "output_ids": [[1, 2, 3], [7]],
                                                    "completion": ["def f(x): return x", "pass"]}},
        {"order": "train", "fields": {}, "batch": None},
        {"order": "checkpoint", "fields": {"folder": "/runs/x/checkpoints/step-000002"}, "batch": None},
        {"order": "stop", "fields": {}, "batch": None},
    ]

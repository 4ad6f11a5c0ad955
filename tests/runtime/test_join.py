"""A joining pool's inputs: one far ahead of the others waits without spinning, and inputs that are each ahead on
groups only the others bring (two generators deal groups to two paths in two orders) are read on, not deadlocked."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch
import zmq

from areal.graph.batch import Batch
from areal.graph.meta import GroupMeta
from areal.runtime.wire.channels import BatchReceiver, BatchSender
from areal.runtime.worker.join import Join
from areal.runtime.worker.main import Worker

CAPACITY = 2


def _part(group: int, field: str) -> tuple[Batch, GroupMeta]:
    ids = torch.tensor([2 * group, 2 * group + 1])
    return (Batch({"sample_id": ids, "group_id": torch.full((2,), group), field: ids.float()}),
            GroupMeta(group=group, samples=2, admitted_at=0))


def test_an_input_is_ahead_only_while_another_is_not():
    join = Join(["a", "b"], {"a": "sample", "b": "sample"}, CAPACITY)
    for group in (1, 2):
        assert join.add("a", *_part(group, "x")) is None
    assert join.ahead("a") and not join.ahead("b")
    for group in (3, 4):  # b's parts are of groups a has not brought: now each waits on the other
        assert join.add("b", *_part(group, "y")) is None
    assert not join.ahead("a") and not join.ahead("b")
    joined = join.add("b", *_part(1, "y"))
    assert joined is not None and joined[0]["sample_id"].tolist() == [2, 3] and {"x", "y"} <= set(joined[0])
    assert join.ahead("b") and not join.ahead("a")  # b holds 3, 4 against a's 2 alone


@pytest.fixture
def joining(tmp_path) -> Iterator[tuple[Worker, dict[str, BatchSender]]]:
    worker, senders = _worker(tmp_path)
    yield worker, senders
    for socket in (*senders.values(), *worker.inboxes.values()):
        socket.close()


def _worker(tmp_path) -> tuple[Worker, dict[str, BatchSender]]:
    """The parts of a joining worker its inputs touch (a whole one loads a recipe and starts its nodes)."""
    worker = object.__new__(Worker)
    worker.poller, worker.inboxes, senders = zmq.Poller(), {}, {}
    for src in ("a", "b"):
        endpoint = f"ipc://{tmp_path}/{src}.sock"
        worker.inboxes[src] = BatchReceiver(endpoint, bind=True)
        worker.poller.register(worker.inboxes[src].socket, zmq.POLLIN)
        senders[src] = BatchSender(endpoint, bind=False)
    worker.join = Join(["a", "b"], {"a": "sample", "b": "sample"}, CAPACITY)
    worker._muted = set()
    worker.control = SimpleNamespace(recv=lambda timeout_ms=0: None)
    worker.config = SimpleNamespace(faults=SimpleNamespace(heartbeat_s=3600.0))
    worker._last_beat = time.monotonic()
    return worker, senders


def _send(senders: dict[str, BatchSender], src: str, *groups: int) -> None:
    for group in groups:
        batch, meta = _part(group, src)
        senders[src].send(batch, meta.to_wire())


def _drained(worker: Worker, want: int, limit_s: float = 10.0) -> list[int]:
    """The groups joined until `want` have come (or the limit passed), waiting as the worker's loop does."""
    groups: list[int] = []
    deadline = time.monotonic() + limit_s
    while len(groups) < want and time.monotonic() < deadline:
        worker._wait(100)
        groups += [meta.group for _, meta in worker._drain()]
    return groups


def test_an_input_far_ahead_is_not_polled_until_the_other_catches_up(joining):
    worker, senders = joining
    _send(senders, "a", 1, 2, 3)
    assert _drained(worker, 1, limit_s=1.0) == []  # a's 1 and 2 are held, its 3 left queued: a is ahead
    start = time.monotonic()
    worker._wait(300)  # a's queued part does not wake the worker: nothing it could do with it
    assert time.monotonic() - start >= 0.25
    _send(senders, "b", 1, 2, 3)
    assert sorted(_drained(worker, 3)) == [1, 2, 3]  # and once b comes, a is read again


def test_inputs_each_ahead_on_groups_the_other_brings_are_read_on_to_the_end(joining):
    worker, senders = joining
    _send(senders, "a", 1, 2)
    _send(senders, "b", 3, 4)
    assert _drained(worker, 1, limit_s=1.0) == []
    _send(senders, "a", 3, 4)
    _send(senders, "b", 1, 2)
    assert sorted(_drained(worker, 4)) == [1, 2, 3, 4]

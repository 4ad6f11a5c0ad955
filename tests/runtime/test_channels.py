from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
from pathlib import Path

import msgpack
import pytest
import torch
import zmq

from areal.graph.batch import Batch, Ragged
from areal.runtime.wire.channels import BatchReceiver, BatchSender, ipc_endpoint, tcp_endpoint

SPAWN = mp.get_context("spawn")


def good_batch(first_id: int, samples: int = 4) -> Batch:
    ids = torch.arange(first_id, first_id + samples, dtype=torch.int64)
    return Batch({
        "sample_id": ids,
        "reward": ids.to(torch.float32) / 10,
        "output_ids": Ragged.from_rows([torch.arange(i % 3) for i in range(samples)]),
        "tests": [{"case": i} for i in range(samples)],
    })


def same(a: Batch, b: Batch) -> bool:
    return (torch.equal(a["sample_id"], b["sample_id"]) and torch.equal(a["reward"], b["reward"])
            and torch.equal(a["output_ids"].values, b["output_ids"].values)
            and torch.equal(a["output_ids"].offsets, b["output_ids"].offsets) and a["tests"] == b["tests"])


def _push_good_garbage_good(endpoint: str, done: mp.synchronize.Event) -> None:
    """Child process: two good batches around two malformed messages, then wait for the reader."""
    sender = BatchSender(endpoint, bind=False, timeout_ms=20_000)
    try:
        sender.send(good_batch(0), {"sender": "child"})
        sender.socket.send_multipart([os.urandom(64), b"junk"])
        n = (10 << 30) // 4
        claims_10_gb = {"v": 1, "meta": {}, "size": n, "fields": [
            {"name": "x", "kind": "tensor", "dtype": "float32", "shape": [n], "nbytes": 10 << 30}]}
        sender.socket.send_multipart([msgpack.packb(claims_10_gb), bytes(4)])
        sender.send(good_batch(100), {"sender": "child"})
        done.wait(60)  # linger is 0: closing before the reader has everything would drop batches
    finally:
        sender.close()


@pytest.fixture
def child_process():
    started: list[mp.process.BaseProcess] = []

    def start(target, *args) -> mp.process.BaseProcess:
        proc = SPAWN.Process(target=target, args=args, daemon=True)
        proc.start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.join(30)
        if proc.is_alive() and proc.pid is not None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(5)


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_batches_cross_processes_and_malformed_ones_between_are_skipped(
    transport, tmp_path: Path, child_process, caplog
):
    endpoint = tcp_endpoint() if transport == "tcp" else ipc_endpoint(tmp_path, "rollout-score")
    done = SPAWN.Event()
    with BatchReceiver(endpoint, bind=True, name="'rollout'") as receiver, \
            caplog.at_level(logging.WARNING, logger="areal.runtime.wire.channels"):
        proc = child_process(_push_good_garbage_good, receiver.endpoint, done)
        first = receiver.recv(timeout_ms=60_000)
        second = receiver.recv(timeout_ms=60_000)
        done.set()
        assert first is not None and second is not None
        assert same(first[0], good_batch(0)) and first[1] == {"sender": "child"}
        assert same(second[0], good_batch(100))
        assert receiver.rejected == 2
        assert receiver.recv(timeout_ms=0) is None
        assert ("frame 1 from 'rollout', field 'x': header says float32[2684354560] (10737418240 B), "
                "over the 1073741824 B limit (max_frame_bytes)") in caplog.text
    proc.join(30)
    assert proc.exitcode == 0


def test_send_raises_after_its_timeout_once_the_high_water_mark_is_reached(tmp_path: Path):
    endpoint = ipc_endpoint(tmp_path, "hwm")
    with BatchReceiver(endpoint, bind=True, hwm=1) as receiver, \
            BatchSender(endpoint, bind=False, hwm=1, timeout_ms=200) as sender:
        sent = 0
        with pytest.raises(TimeoutError, match=r"send on ipc://.*: no room after 200 ms; .*high-water mark"):
            while sent < 1000:
                sender.send(good_batch(sent).merge({"big": torch.zeros(4, 64 * 1024)}))
                sent += 1
        assert 0 < sent < 1000
        got = [receiver.recv(timeout_ms=5_000) for _ in range(sent)]
        assert [int(b["sample_id"][0]) for b, _ in got] == list(range(sent))  # type: ignore[misc]
        assert receiver.recv(timeout_ms=50) is None
        sender.send(good_batch(sent))  # room again once the receiver drained its queue
        assert receiver.recv(timeout_ms=5_000) is not None


def test_recv_returns_none_when_nothing_arrives_in_time():
    with BatchReceiver(tcp_endpoint(), bind=True) as receiver:
        assert receiver.recv(timeout_ms=20) is None
        assert receiver.rejected == 0


def test_several_receivers_are_served_through_one_zmq_poller():
    with BatchReceiver(tcp_endpoint(), bind=True) as a, BatchReceiver(tcp_endpoint(), bind=True) as b, \
            BatchSender(b.endpoint, bind=False, timeout_ms=5_000) as to_b:
        poller = zmq.Poller()
        poller.register(a.socket, zmq.POLLIN)
        poller.register(b.socket, zmq.POLLIN)
        to_b.send(good_batch(7))
        ready = dict(poller.poll(5_000))
        assert list(ready) == [b.socket]
        got = b.recv(timeout_ms=0)
        assert got is not None and same(got[0], good_batch(7))


def test_a_sender_may_bind_and_receivers_connect():
    with BatchSender(tcp_endpoint(), bind=True, timeout_ms=5_000) as sender, \
            BatchReceiver(sender.endpoint, bind=False) as receiver:
        sender.send(good_batch(3))
        got = receiver.recv(timeout_ms=5_000)
        assert got is not None and same(got[0], good_batch(3))


def test_a_sender_without_peers_takes_them_as_they_come_and_drops_one_that_left():
    with BatchReceiver(tcp_endpoint(), bind=True) as second, BatchSender(None, bind=False, timeout_ms=200) as sender:
        with pytest.raises(TimeoutError):
            sender.send(good_batch(1))  # no peer yet: nothing is queued for later
        first = BatchReceiver(tcp_endpoint(), bind=True)
        # ZeroMQ drops a dead peer's connection in its I/O thread, and a batch sent before that is lost with
        # it (the runtime re-issues such groups); the first retry to reach the peer comes after the drop
        monitor = sender.socket.get_monitor_socket(zmq.EVENT_CONNECT_RETRIED)
        try:
            sender.connect(first.endpoint)
            sender.connect(first.endpoint)  # a repeat changes nothing
            sender.send(good_batch(2), timeout_ms=5_000)
            got = first.recv(timeout_ms=5_000)
            assert got is not None and same(got[0], good_batch(2)) and sender.peers == {first.endpoint}
            first.close()  # the peer leaves (its process died), as the controller learns before it rewires
            assert monitor.poll(5_000), "the sender never dropped the connection to the peer that left"
        finally:
            sender.socket.disable_monitor()
            monitor.close(linger=0)
        sender.disconnect(first.endpoint)
        sender.connect(second.endpoint)
        assert sender.peers == {second.endpoint}
        for n in (3, 4):  # everything sent once the old connection is down reaches the new peer
            sender.send(good_batch(n), timeout_ms=5_000)
            got = second.recv(timeout_ms=5_000)
            assert got is not None and same(got[0], good_batch(n))


def test_binding_a_non_loopback_address_is_refused_unless_allowed():
    with pytest.raises(ValueError, match=r"refusing to bind tcp://0\.0\.0\.0:\*: not a loopback address"):
        BatchReceiver("tcp://0.0.0.0:*", bind=True)


def test_ipc_endpoint_in_a_deep_run_dir_falls_back_to_a_short_shared_path(tmp_path: Path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    endpoint = ipc_endpoint(deep, "rollout-score")
    assert endpoint == ipc_endpoint(deep, "rollout-score")
    assert len(endpoint.removeprefix("ipc://").encode()) <= 107
    assert ipc_endpoint(tmp_path, "x") == f"ipc://{tmp_path}/x"
    with BatchReceiver(endpoint, bind=True) as receiver, \
            BatchSender(endpoint, bind=False, timeout_ms=5_000) as sender:
        sender.send(good_batch(1))
        assert receiver.recv(timeout_ms=5_000) is not None
        assert Path(endpoint.removeprefix("ipc://")).exists()
        folder = Path(endpoint.removeprefix("ipc://")).parent  # in the temp dir: this user's alone
        assert folder.name == f"areal-{os.getuid()}" and (folder.stat().st_mode & 0o777) == 0o700
    assert not Path(endpoint.removeprefix("ipc://")).exists()  # the binding end removes its socket file


def test_ipc_endpoint_refuses_a_name_that_is_not_a_plain_file_name(tmp_path: Path):
    with pytest.raises(ValueError, match=r"channel name '\.\./x'"):
        ipc_endpoint(tmp_path, "../x")

"""Nobody but the run's own processes can talk to its sockets: TCP ones need the run's CURVE key, ipc ones
live in a folder only the run's user can enter."""

from __future__ import annotations

import json
import shutil
import stat
import threading
from pathlib import Path

import msgpack
import torch
import zmq

from areal.cli.run import build_controller
from areal.graph.batch import Batch
from areal.runtime.wire.channels import BatchReceiver, BatchSender, tcp_endpoint
from areal.runtime.wire.control import ControlClient, ControlServer, pack
from areal.runtime.wire.messages import Heartbeat
from areal.runtime.wire.security import RunKey

RECIPE = Path(__file__).with_name("fake_rl.py")


def batch(first: int) -> Batch:
    return Batch({"sample_id": torch.arange(first, first + 2)})


def test_a_sender_without_the_run_key_delivers_nothing_and_one_with_it_delivers():
    key, stranger_key = RunKey.create(), RunKey.create()
    with BatchReceiver(tcp_endpoint(), bind=True, key=key) as receiver:
        strangers = [BatchSender(receiver.endpoint, bind=False, timeout_ms=1000)]  # no CURVE at all
        knows_the_public_key = BatchSender(None, bind=False, timeout_ms=1000)
        RunKey(key.public, stranger_key.secret).dial(knows_the_public_key.socket)  # a key pair that does not match
        knows_the_public_key.socket.connect(receiver.endpoint)
        strangers.append(knows_the_public_key)
        try:
            for k, stranger in enumerate(strangers):
                try:
                    stranger.send(batch(100 + 10 * k), {"from": "stranger"})
                except TimeoutError:
                    pass  # refused before it could even queue: nothing to deliver either way
            with BatchSender(receiver.endpoint, bind=False, key=key, timeout_ms=5000) as member:
                member.send(batch(0), {"from": "member"})
                got = receiver.recv(timeout_ms=10_000)
                assert got is not None and got[1] == {"from": "member"}
                assert receiver.recv(timeout_ms=300) is None  # the strangers' batches never arrived
        finally:
            for stranger in strangers:
                stranger.close()


def test_control_messages_without_the_run_key_never_reach_the_controller(tmp_path):
    key = RunKey.create()
    server = ControlServer("tcp://127.0.0.1:*", key)
    endpoint = server.endpoint
    forger = zmq.Context.instance().socket(zmq.DEALER)
    forger.setsockopt(zmq.IDENTITY, b"actor[0]")
    forger.setsockopt(zmq.LINGER, 0)
    forger.connect(endpoint)
    member = ControlClient(endpoint, "rollout[0]", key)
    try:
        forger.send(pack({"type": "error", "message": "stop the run"}), zmq.NOBLOCK)
        member.send(Heartbeat(busy=0.5))
        got = server.recv(10_000)
        assert got == ("rollout[0]", {"type": "heartbeat", "busy": 0.5})
        assert server.recv(300) is None
    finally:
        forger.close(linger=0)
        member.close()
        server.close()


def test_a_tcp_run_flooded_by_a_stranger_trains_every_sample_once_and_keeps_its_key_private(tmp_path):
    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    controller = build_controller(recipe, ["transport.kind=tcp", "steps=4", "batch_size=2", "group_size=2"],
                                  tmp_path / "run")
    plan = controller.plan
    stop, control_flooded = threading.Event(), threading.Event()
    forged = {"type": "stop"}
    header = msgpack.packb({"v": 1, "meta": {"group": 0, "samples": 1}, "size": 0, "fields": []})

    def attach(context: zmq.Context, kind: int, endpoint: str) -> zmq.Socket:
        s = context.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 10)
        s.connect(endpoint)
        return s

    def flood() -> None:
        context = zmq.Context.instance()
        sockets = [attach(context, zmq.PUSH, e) for c in plan.channels for e in c.endpoints]
        while not stop.wait(0.01):
            control = controller.plan.control_endpoint  # its port is known once the controller has bound it
            if not control_flooded.is_set() and not control.endswith(":*"):
                sockets.append(attach(context, zmq.DEALER, control))
                control_flooded.set()
            for s in sockets:
                try:
                    s.send_multipart([pack(forged)] if s.type == zmq.DEALER else [header], zmq.NOBLOCK)
                except zmq.Again:
                    pass
        for s in sockets:
            s.close(linger=0)

    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    try:
        state = controller.run()
    finally:
        stop.set()
        flooder.join(10)
    run = Path(plan.run_dir)
    ids = sorted(s for line in (run / "trained.jsonl").read_text().splitlines() for s in json.loads(line)["sample_ids"])
    assert control_flooded.is_set()
    assert state.version == 4 and ids == list(range(4 * 2 * 2))
    assert controller.accounting.duplicates == 0
    assert stat.S_IMODE((run / "run.key").stat().st_mode) == 0o600


def test_ipc_sockets_live_in_a_folder_only_the_runs_user_can_enter(tmp_path):
    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    controller = build_controller(recipe, ["steps=1", "batch_size=1", "group_size=1"], tmp_path / "run")
    controller.run()
    folder = Path(controller.plan.control_endpoint.removeprefix("ipc://")).parent
    assert folder == Path(controller.plan.run_dir) / "sockets"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700

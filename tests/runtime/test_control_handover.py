"""A restarted worker connects to the controller under the id its predecessor had. The controller's socket drops
the predecessor's connection only on its next call after the kernel closed it, so the newcomer can arrive first:
it must be heard (its "ready") and reached (its weights), or a run waits on it forever."""

from __future__ import annotations

from areal.runtime.wire.commands import TakeCensus
from areal.runtime.wire.control import ControlClient, ControlServer
from areal.runtime.wire.messages import Heartbeat, Ready


def test_a_worker_started_again_under_its_id_is_heard_and_reached_while_the_old_connection_lingers(tmp_path):
    server = ControlServer(f"ipc://{tmp_path}/control")
    old = ControlClient(server.endpoint, "rollout[0]")
    new = None
    try:
        old.send(Heartbeat(busy=0.5))
        assert server.recv(10_000) == ("rollout[0]", {"type": "heartbeat", "busy": 0.5})
        new = ControlClient(server.endpoint, "rollout[0]")  # the predecessor's connection is still open
        new.send(Ready(pid=7))
        assert server.recv(10_000) == ("rollout[0]", {"type": "ready", "pid": 7})
        assert server.send("rollout[0]", TakeCensus(seq=3))
        assert new.recv(10_000) == {"type": "census", "seq": 3}  # the controller's answer goes to the newcomer
        assert old.recv(200) is None
    finally:
        old.close()
        if new is not None:
            new.close()
        server.close()

"""The control plane: small msgpack dicts between the controller and every worker.

Workers hold a DEALER socket named by their worker id (`score[1]`); the controller holds the
ROUTER. A worker's `Pulse` thread holds a second one (`score[1]/pulse`) that keeps saying "alive"
while the main loop is inside a long node call (a reward batch of slow tests, a big update).
On the socket a message is a plain map with a "type"; in the code it is one typed class per kind
(messages.py from workers, commands.py from the controller), which senders build and receivers
parse. Like the data plane, nothing here is ever unpickled: msgpack with tight limits, and a map
that is not msgpack or has no "type" is dropped with a log line.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import zmq

from areal.runtime.wire.channels import private_folder
from areal.runtime.wire.commands import Command
from areal.runtime.wire.messages import Alive, Message
from areal.runtime.wire.security import RunKey

log = logging.getLogger(__name__)

_LIMITS = dict(max_bin_len=1 << 20, max_str_len=1 << 20, max_array_len=1 << 20, max_map_len=1 << 16)


def pack(message: dict[str, Any]) -> bytes:
    return msgpack.packb(message, use_bin_type=True)


def unpack(data: bytes, sender: str) -> dict[str, Any] | None:
    try:
        message = msgpack.unpackb(data, raw=False, strict_map_key=True, **_LIMITS)
    except Exception as err:  # msgpack raises several unrelated types on garbage
        log.warning("control message from %s is not msgpack: %s", sender, err)
        return None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        log.warning("control message from %s has no 'type': %r", sender, str(message)[:200])
        return None
    return message


class ControlClient:
    """A worker's end: send events, receive commands."""

    def __init__(self, endpoint: str, worker_id: str, key: RunKey | None = None,
                 context: zmq.Context | None = None) -> None:
        """`key`: the run's key, when the control plane is TCP (security.py)."""
        self.worker_id = worker_id
        self.socket = (context or zmq.Context.instance()).socket(zmq.DEALER)
        self.socket.setsockopt(zmq.IDENTITY, worker_id.encode())
        if key is not None:
            key.dial(self.socket)
        self.socket.setsockopt(zmq.LINGER, 2000)  # let the last events (error, version) reach the controller
        self.socket.connect(endpoint)

    def send(self, message: Message) -> None:
        self.socket.send(pack(message.to_wire()))

    def recv(self, timeout_ms: int = 0) -> dict[str, Any] | None:
        if not self.socket.poll(timeout_ms, zmq.POLLIN):
            return None
        return unpack(self.socket.recv(), "controller")

    def close(self) -> None:
        self.socket.close()


class Pulse:
    """A thread that tells the controller "alive" every `interval_s`, whatever the main loop does.

    The main loop's heartbeats carry stats and stop while a node computes; pulses keep coming, so
    the controller's silence check catches a frozen process (stopped, or hung in C code holding the
    GIL), not a node that is merely slow. A pulse also says a node call that has lasted far longer
    than its kind's (`long_call`), so a node stuck in Python is seen too.
    """

    SUFFIX = "/pulse"

    def __init__(self, endpoint: str, worker_id: str, interval_s: float, key: RunKey | None = None,
                 long_call: Callable[[], str] = str) -> None:
        self._stopped = threading.Event()
        self._long_call = long_call  # what the main thread has been in for long, read from this thread; "" if none
        self._thread = threading.Thread(target=self._run, args=(endpoint, worker_id + self.SUFFIX, interval_s, key),
                                        name="pulse", daemon=True)
        self._thread.start()

    def _run(self, endpoint: str, identity: str, interval_s: float, key: RunKey | None) -> None:
        client = ControlClient(endpoint, identity, key)  # a socket of this thread's own: zmq sockets are not shared
        try:
            while not self._stopped.wait(interval_s):
                client.send(Alive(long_call=self._long_call()))
        finally:
            client.close()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()


class ControlServer:
    """The controller's end: one ROUTER bound for all workers."""

    def __init__(self, endpoint: str, key: RunKey | None = None, context: zmq.Context | None = None) -> None:
        self.socket = (context or zmq.Context.instance()).socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to a vanished worker raises, not drops
        # a restarted worker connects under its predecessor's id, maybe before this socket has dropped the dead
        # connection (it does so on its next call): the newcomer takes the id over instead of being ignored
        self.socket.setsockopt(zmq.ROUTER_HANDOVER, 1)
        if key is not None:
            key.serve(self.socket)
        if endpoint.startswith("ipc://"):
            private_folder(Path(endpoint[len("ipc://"):]).parent)
        if endpoint.endswith(":*"):  # the port is picked while bound: no other process can take it meanwhile
            host = endpoint.rpartition(":")[0]
            endpoint = f"{host}:{self.socket.bind_to_random_port(host)}"
        else:
            self.socket.bind(endpoint)
        self.endpoint = endpoint  # the concrete address the workers connect to
        self.received = self.sent = 0  # messages, for the controller's step records (its load)

    def recv(self, timeout_ms: int) -> tuple[str, dict[str, Any]] | None:
        if not self.socket.poll(timeout_ms, zmq.POLLIN):
            return None
        identity, data = self.socket.recv_multipart()
        self.received += 1
        sender = identity.decode(errors="replace")
        message = unpack(data, sender)
        return (sender, message) if message is not None else None

    def send(self, worker_id: str, command: Command) -> bool:
        """False when the worker is not connected (it died or has not started yet)."""
        try:
            self.socket.send_multipart([worker_id.encode(), pack(command.to_wire())], zmq.NOBLOCK)
            self.sent += 1
            return True
        except (zmq.Again, zmq.ZMQError):
            return False

    def close(self) -> None:
        self.socket.close()

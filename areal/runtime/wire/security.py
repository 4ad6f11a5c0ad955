"""Who may talk to a run's sockets: its own processes, and nobody else on the machine.

ipc sockets live in a folder only the run's user can enter (mode 0700), so the kernel keeps
other users out. TCP sockets are reachable by anyone on the host (and on the network with
`transport.host=node`), so a run that uses TCP secures every socket with ZeroMQ's CURVE: one
keypair per run, made by the controller and kept in RUN_DIR/run.key (mode 0600). Every bound
socket is a CURVE server whose ZAP handler admits only clients presenting the run's key, and
every connecting socket presents it. A stranger can then neither inject a batch or a control
message nor stop a run, and what crosses the network is encrypted. This module only arms
sockets; which sockets exist is the plan's business.
"""

from __future__ import annotations

import hmac
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.auth.thread import ThreadAuthenticator

KEY_FILE = "run.key"
_guard = threading.Lock()
_authenticators: dict[int, ThreadAuthenticator] = {}  # id(context) -> its ZAP handler, one per process


@dataclass(frozen=True)
class RunKey:
    """The run's CURVE keypair (z85 text); whoever holds it is part of the run."""

    public: bytes
    secret: bytes

    @classmethod
    def create(cls) -> RunKey:
        public, secret = zmq.curve_keypair()
        return cls(public, secret)

    def write(self, run_dir: Path) -> Path:
        """RUN_DIR/run.key, readable by this user only (created so, never widened after)."""
        path = Path(run_dir) / KEY_FILE
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"public": self.public.decode(), "secret": self.secret.decode()}, out)
        os.replace(tmp, path)
        return path

    @classmethod
    def read(cls, run_dir: Path | str) -> RunKey:
        raw = json.loads((Path(run_dir) / KEY_FILE).read_text())
        return cls(raw["public"].encode(), raw["secret"].encode())

    def serve(self, socket: zmq.Socket) -> None:
        """Arm a socket that binds: CURVE server, admitting only clients that hold this key."""
        _authenticator(socket.context, self.public)
        socket.setsockopt(zmq.ZAP_DOMAIN, b"areal")
        socket.curve_server = True
        socket.curve_secretkey = self.secret
        socket.curve_publickey = self.public

    def dial(self, socket: zmq.Socket) -> None:
        """Arm a socket that connects: present the run's key, and talk only to a server holding it."""
        socket.curve_serverkey = self.public
        socket.curve_publickey = self.public
        socket.curve_secretkey = self.secret


class _RunKeys:
    """ZAP credentials check: the client's public key must be a run's (a process may hold several runs, as tests do)."""

    def __init__(self) -> None:
        self.allowed: set[bytes] = set()

    def callback(self, domain: str, key: bytes) -> bool:
        return any(hmac.compare_digest(key, public) for public in self.allowed)


_keys = _RunKeys()


def _authenticator(context: zmq.Context, public: bytes) -> None:
    """Start this process's ZAP handler once per context (a daemon thread); admit `public` from now on."""
    with _guard:
        _keys.allowed.add(public)
        if id(context) in _authenticators:
            return
        auth = ThreadAuthenticator(context)
        auth.start()
        auth.configure_curve_callback(domain="areal", credentials_provider=_keys)
        _authenticators[id(context)] = auth

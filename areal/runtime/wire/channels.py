"""The data plane's sockets: a PUSH end that sends batches and a PULL end that receives them.

One job: put `codec` frames on a ZeroMQ socket and take them off, zero-copy both ways.
Back-pressure is ZeroMQ's own: once every peer's queue holds `hwm` messages, `send` blocks
(or raises after its timeout). A malformed message never stops a receiver: it is logged,
counted in `rejected` and skipped. Which pool talks to which, and over which endpoint, is
the plan's business (`plan.py`), not this module's.

Every socket closes with linger 0: a sender must not close while its last batches are
still in flight (the controller's acks say when they arrived), or they are dropped.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import zmq

from areal.errors import WireError
from areal.graph.batch import Batch
from areal.runtime.wire.codec import MAX_HEADER_BYTES, decode, encode
from areal.runtime.wire.security import RunKey

log = logging.getLogger(__name__)

IPC_PATH_MAX = 107  # sockaddr_un.sun_path holds 108 bytes, the last one a NUL
_CHANNEL_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,100}")


def ipc_endpoint(folder: Path | str, name: str) -> str:
    """`ipc://FOLDER/NAME`, or a short path in a private folder of the temp dir when that one is too long.

    A socket path holds at most 107 bytes, which a deep run directory exceeds. The short path
    is a hash of the long one, so every process of the run that calls this with the same
    arguments gets the same endpoint.
    """
    if not _CHANNEL_NAME.fullmatch(name):
        raise ValueError(f"channel name {name!r}: use 1..100 letters, digits, '_', '.' or '-'")
    path = str(Path(folder) / name)  # the plan passes the run directory resolved (or its placeholder, for viz)
    if len(path.encode()) > IPC_PATH_MAX:
        digest = hashlib.sha256(path.encode()).hexdigest()[:16]
        path = str(Path(tempfile.gettempdir()) / f"areal-{os.getuid()}" / f"{digest}.sock")
    return f"ipc://{path}"


def private_folder(folder: Path) -> None:
    """Make `folder` (where ipc sockets are bound) this user's alone: other users cannot connect to what is in it."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.stat()
    if info.st_uid != os.getuid():
        raise PermissionError(f"{folder} belongs to uid {info.st_uid}, not to this user: its sockets would not be "
                              "private; remove it or choose another run directory")
    if info.st_mode & 0o077:
        folder.chmod(0o700)


def is_dynamic(endpoints: tuple[str, ...]) -> bool:
    """Endpoints whose port (and, for host 'node', address) the binding worker picks when it starts."""
    return any(e.endswith(":*") for e in endpoints)


def bind_address(endpoint: str) -> str:
    """The endpoint a worker binds: `tcp://node:*` becomes its Ray node's IP (AREAL_NODE_IP), any free port."""
    if endpoint.startswith("tcp://node:"):
        return f"tcp://{os.environ['AREAL_NODE_IP']}:{endpoint.rpartition(':')[2]}"
    return endpoint


def tcp_endpoint(host: str = "127.0.0.1", port: int | None = None) -> str:
    """`tcp://HOST:PORT`; without a port, `tcp://HOST:*`: the binding end picks a free one."""
    return f"tcp://{host}:{'*' if port is None else port}"


class BatchSender:
    """The PUSH end of a channel; with several peers, batches are dealt round-robin."""

    def __init__(
        self,
        endpoint: str | None,
        *,
        bind: bool,
        hwm: int = 16,
        timeout_ms: int | None = None,
        allow_remote: bool = False,
        key: RunKey | None = None,
        max_frame_bytes: int | None = None,
        max_header_bytes: int | None = None,
        context: zmq.Context | None = None,
    ) -> None:
        """`hwm`: messages queued per peer before `send` blocks; `timeout_ms`: how long it
        blocks before raising `TimeoutError` (None: forever). `endpoint` None: no peer yet;
        `connect` adds them as they become known, and only live connections take batches.
        `key`: the run's key, for TCP (security.py). The frame limits are the receivers': a batch
        over them raises `FrameTooLarge` here instead of vanishing there."""
        self.socket = _socket(context, zmq.PUSH, zmq.SNDHWM, hwm)
        self.limits = {"max_frame_bytes": max_frame_bytes, "max_header_bytes": max_header_bytes}
        if key is not None:
            key.serve(self.socket) if bind else key.dial(self.socket)
        self.hwm = hwm
        self.timeout_ms = timeout_ms
        self._sndtimeo = -1
        self._bound = bind
        self.peers: set[str] = set()
        if endpoint is None:
            # queue nothing for a peer that is not (or no longer) there: it may never come back
            self.socket.setsockopt(zmq.IMMEDIATE, 1)
            self.endpoint = "(peers as they come)"
        else:
            self.endpoint = _attach(self.socket, endpoint, bind, allow_remote)

    def connect(self, endpoint: str) -> None:
        """One more receiver to deal batches to (a repeat is ignored)."""
        if endpoint not in self.peers:
            try:
                self.socket.connect(endpoint)
            except zmq.ZMQError as exc:
                raise zmq.ZMQError(exc.errno, f"cannot connect {endpoint}: {exc.strerror}") from exc
            self.peers.add(endpoint)

    def disconnect(self, endpoint: str) -> None:
        """Stop dealing to a receiver that went away; batches queued for it are dropped (and re-issued)."""
        if endpoint in self.peers:
            self.socket.disconnect(endpoint)
            self.peers.discard(endpoint)

    def send(
        self, batch: Batch, meta: Mapping[str, Any] | None = None, *, timeout_ms: int | None = None
    ) -> None:
        """Queue `batch` without copying its tensors: do not modify them in place afterwards,
        ZeroMQ reads them after `send` returns. `timeout_ms` overrides the sender's default."""
        timeout = timeout_ms if timeout_ms is not None else self.timeout_ms
        wanted = -1 if timeout is None else timeout
        if wanted != self._sndtimeo:
            self.socket.setsockopt(zmq.SNDTIMEO, wanted)
            self._sndtimeo = wanted
        frames = encode(batch, meta, **self.limits)
        try:
            self.socket.send_multipart(frames, copy=False)
        except zmq.Again:
            raise TimeoutError(
                f"send on {self.endpoint}: no room after {wanted} ms; every receiver already holds "
                f"{self.hwm} queued batches (high-water mark) or none is connected"
            ) from None

    def close(self) -> None:
        _close(self.socket, self.endpoint, self._bound)

    def __enter__(self) -> BatchSender:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class BatchReceiver:
    """The PULL end of a channel. Several receivers are polled by registering each one's
    `socket` in a `zmq.Poller`, then calling `recv(timeout_ms=0)` on the ready ones."""

    def __init__(
        self,
        endpoint: str,
        *,
        bind: bool,
        hwm: int = 16,
        max_frame_bytes: int = 1 << 30,
        max_header_bytes: int = MAX_HEADER_BYTES,
        name: str | None = None,
        allow_remote: bool = False,
        key: RunKey | None = None,
        context: zmq.Context | None = None,
    ) -> None:
        """`name` is how rejected messages name their sender in logs (the upstream pool); `key`: as for a sender."""
        self.socket = _socket(context, zmq.PULL, zmq.RCVHWM, hwm)
        if key is not None:
            key.serve(self.socket) if bind else key.dial(self.socket)
        # ZeroMQ drops a peer that sends a larger frame before allocating it; the run's own senders check first
        self.socket.setsockopt(zmq.MAXMSGSIZE, max(max_frame_bytes, max_header_bytes))
        self.max_frame_bytes, self.max_header_bytes = max_frame_bytes, max_header_bytes
        self.rejected = 0
        self._bound = bind
        self.endpoint = _attach(self.socket, endpoint, bind, allow_remote)
        self.name = name or repr(self.endpoint)

    def recv(self, timeout_ms: int | None = None) -> tuple[Batch, dict[str, Any]] | None:
        """The next well-formed batch and its meta, or None after `timeout_ms` (None: wait forever).

        Malformed messages met on the way are logged, counted and skipped.
        """
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        while True:
            wait = None if deadline is None else max(0, round((deadline - time.monotonic()) * 1000))
            if not self.socket.poll(wait, zmq.POLLIN):
                return None
            try:
                frames = self.socket.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                continue
            try:
                return decode(frames, sender=self.name, max_frame_bytes=self.max_frame_bytes,
                              max_header_bytes=self.max_header_bytes)
            except WireError as exc:
                self.rejected += 1
                log.warning("%s: skipped a malformed message (%d so far): %s",
                            self.endpoint, self.rejected, exc)

    def close(self) -> None:
        _close(self.socket, self.endpoint, self._bound)

    def __enter__(self) -> BatchReceiver:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _socket(context: zmq.Context | None, kind: int, hwm_option: int, hwm: int) -> zmq.Socket:
    if hwm < 1:
        raise ValueError(f"high-water mark must be >= 1 message, got {hwm} (0 would mean unbounded queues)")
    socket = (context or zmq.Context.instance()).socket(kind)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(hwm_option, hwm)
    return socket


def _attach(socket: zmq.Socket, endpoint: str, bind: bool, allow_remote: bool) -> str:
    """Bind or connect; return the concrete endpoint (a bound `tcp://HOST:*` gets its port)."""
    try:
        if not bind:
            socket.connect(endpoint)
            return endpoint
        if endpoint.startswith("ipc://"):
            private_folder(Path(endpoint[len("ipc://"):]).parent)
        if endpoint.startswith("tcp://"):
            host, _, port = endpoint[len("tcp://"):].rpartition(":")
            if not (allow_remote or _is_loopback(host)):
                raise ValueError(f"refusing to bind {endpoint}: not a loopback address "
                                 "(pass allow_remote=True where the plan spans machines)")
            socket.setsockopt(zmq.IPV6, int(host.startswith("[")))
            if port == "*":
                return f"tcp://{host}:{socket.bind_to_random_port(f'tcp://{host}')}"
        socket.bind(endpoint)
        return endpoint
    except zmq.ZMQError as exc:
        socket.close(linger=0)
        verb = "bind" if bind else "connect"
        raise zmq.ZMQError(exc.errno, f"cannot {verb} {endpoint}: {exc.strerror}") from exc
    except ValueError:
        socket.close(linger=0)
        raise


def _close(socket: zmq.Socket, endpoint: str, bound: bool) -> None:
    socket.close(linger=0)
    if bound and endpoint.startswith("ipc://"):
        # libzmq leaves the socket file behind; the binding end owns it
        Path(endpoint[len("ipc://"):]).unlink(missing_ok=True)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"

"""transport.weights=tcp: each follower fetches a version from its trainer over TCP, so weights reach a node that
shares no disk and no machine with the trainer.

The trainer's rank 0 keeps the newest `keep` versions in its memory, each as one msgpack index (name, dtype,
shape) and the tensors' bytes, and serves them from a thread on a ZeroMQ ROUTER socket bound where the data plane
binds (transport.host: loopback, or the Ray node's IP). A follower told of version v asks for it on a DEALER
socket and gets the index and one frame per tensor, sent without copying and read in place (`torch.frombuffer`),
then copied only into its model. Pulled, not pushed: a follower that restarts, or lands on a node added later,
asks for what it is told to hold and gets it, which a broadcast group (fixed when it forms) cannot give. Both
sockets carry the run's CURVE key like every TCP socket of the run (wire/security.py), so what crosses the network
is encrypted and a stranger is answered nothing.

A follower that asks for a version the trainer has since dropped (it published `keep` newer ones) is told the
newest it holds and keeps what it has: that version's update follows. A trainer that does not answer within
`ANSWER_TIMEOUT_S` is an error naming its endpoint. A follower told to stop while it waits (its trainer's node
lost, the run ending) gives up the fetch at once and keeps what it holds, rather than wait out that timeout. Chosen
over torch.distributed (gloo) by shape more than by speed: gloo's group is fixed when it forms, so a restarted
follower, or one on a node added later, could not join it; benchmarks/bench_weights.py times both routes (its `tcp`
and `broadcast` rows, docs/benchmarks.md). The checkpoint gets the policy as a file, written by the trainer (no
published file exists to copy).
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import msgpack  # type: ignore[import-untyped]
import torch
import zmq
from torch import Tensor

from areal.errors import RunError
from areal.graph.roles import Follower
from areal.runtime.storage.checkpoint import policy_name
from areal.runtime.weights.transport import Source, Transport
from areal.runtime.wire.channels import bind_address
from areal.runtime.wire.security import RunKey
from areal.runtime.wire.weight_update import Via

KIND = "tcp"
ANSWER_TIMEOUT_S = 300.0  # a version of a large model takes a while at the far end of a slow link
POLL_MS = 200  # how often the serving thread, and a waiting follower, look whether they should stop
logger = logging.getLogger(__name__)
_keys: list[RunKey] = []  # the run's key in this process (a worker arms it once: `use_run_key`)
_stop_asked: list[Callable[[], bool]] = []  # the worker's "was I told to stop?" (armed with the key)


def use_run_key(key: RunKey | None, stop_asked: Callable[[], bool] | None = None) -> None:
    """The key this process's sockets present (the run's, read from its run directory; None: loopback, unarmed),
    and what a fetch asks while it waits, to give up when the worker is told to stop."""
    _keys[:] = [key] if key is not None else []
    _stop_asked[:] = [stop_asked] if stop_asked is not None else []


class TcpPublisher:
    def __init__(self, source: Source) -> None:
        self.source = source
        self.versions: dict[int, tuple[bytes, list[Tensor]]] = {}  # version -> (index, tensors), the newest `keep`
        self.served_bytes = 0  # sent to followers, every fetch of every version (the step records' weights_sent_mib)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.endpoint = ""
        self._thread: threading.Thread | None = None
        if not source.rank_follower:
            socket = zmq.Context.instance().socket(zmq.ROUTER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.SNDHWM, 0)  # a version is one message per follower: never drop one
            if _keys:
                _keys[0].serve(socket)
            socket.bind(bind_address(f"tcp://{source.config.transport.host}:*"))
            self.endpoint = socket.getsockopt_string(zmq.LAST_ENDPOINT)
            # the socket is the thread's from here on (ZeroMQ sockets are not shared between threads)
            self._thread = threading.Thread(target=self._serve, args=(socket,), name="weights-tcp", daemon=True)
            self._thread.start()

    def publish(self, version: int) -> Via | None:
        weights = self.source.gather()  # every rank: gathering is a collective
        if self.source.rank_follower:
            return None
        # copied to the host: the engine's tensors change at its next step, while followers may still ask
        tensors = [t.detach().to("cpu", copy=True).contiguous() for t in weights.values()]
        index = msgpack.packb([(name, str(t.dtype).removeprefix("torch."), list(t.shape))
                               for name, t in zip(weights, tensors)])
        with self._lock:
            self.versions[version] = (index, tensors)
            for old in [v for v in self.versions if not version - self.source.keep < v <= version]:
                del self.versions[old]
        return Via(KIND, self.endpoint, weights=self.source.weights)

    def reported(self) -> None:
        pass

    def sent_bytes(self) -> int:
        return self.served_bytes  # an int, written by the serving thread alone

    def checkpoint(self, folder: Path) -> None:
        self.source.save(None if self.source.rank_follower else str(folder / policy_name(self.source.model)))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)
        with self._lock:
            self.versions.clear()

    def _serve(self, socket: zmq.Socket) -> None:
        """Answer each request (a version) with its index and tensors, or with the newest version held."""
        try:
            while not self._stop.is_set():
                if not socket.poll(POLL_MS):
                    continue
                peer, request = socket.recv_multipart()
                try:
                    version = int(msgpack.unpackb(request)["version"])
                except (ValueError, TypeError, KeyError, msgpack.UnpackException):
                    logger.warning("weights request that is not one: %r", request[:100])
                    continue
                with self._lock:
                    held = self.versions.get(version)
                    newest = max(self.versions, default=-1)
                if held is None:
                    socket.send_multipart([peer, msgpack.packb({"missing": version, "newest": newest})])
                    continue
                index, tensors = held
                frames = [t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b"" for t in tensors]
                socket.send_multipart([peer, index, *frames], copy=False)
                self.served_bytes += sum(t.numel() * t.element_size() for t in tensors)
        finally:
            socket.close(linger=0)


def receive(via: Via, follower: Follower, version: int) -> bool:
    """Fetch `version` from the trainer at `via.where` and load it. False if the trainer has dropped it since (it
    published `keep` newer versions: the newest's update follows) or the worker was told to stop meanwhile: the
    follower keeps what it holds."""
    state = fetch(via.where, version)
    if state is None:
        return False
    follower.load_weights(state, version)
    return True


def fetch(endpoint: str, version: int, timeout_s: float = ANSWER_TIMEOUT_S) -> dict[str, Tensor] | None:
    """Version `version`'s tensors from the trainer serving at `endpoint`; None when it holds only newer ones, or
    when the worker is told to stop while it waits."""
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        if _keys:
            _keys[0].dial(socket)
        socket.connect(endpoint)
        socket.send(msgpack.packb({"version": version}))
        deadline = time.monotonic() + timeout_s
        while not socket.poll(max(0, min(POLL_MS, int((deadline - time.monotonic()) * 1000)))):
            if _stop_asked and _stop_asked[0]():
                logger.info("weights v%d: told to stop while waiting for the trainer at %s; keeping what it holds",
                            version, endpoint)
                return None
            if time.monotonic() >= deadline:
                raise RunError(f"weights v{version}: the trainer at {endpoint} did not answer within "
                               f"{timeout_s:.0f} s")
        frames = socket.recv_multipart(copy=False)
    finally:
        socket.close(linger=0)
    head = msgpack.unpackb(frames[0].bytes)
    if isinstance(head, dict):  # the version is gone
        if head.get("newest", -1) > version:
            logger.info("weights v%d were superseded by v%d before they could be fetched; waiting for its update",
                        version, head["newest"])
            return None
        raise RunError(f"weights v{version}: the trainer at {endpoint} does not hold it "
                       f"(newest: v{head.get('newest')})")
    state = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a received frame is read-only; the follower copies it
        for (name, dtype_name, shape), frame in zip(head, frames[1:], strict=True):
            dtype = getattr(torch, dtype_name)
            flat = torch.frombuffer(frame.buffer, dtype=torch.uint8) if len(frame.buffer) else \
                torch.empty(0, dtype=torch.uint8)
            state[name] = flat.view(dtype).view(shape)
    return state


TRANSPORT = Transport(publisher=TcpPublisher, receive=receive)

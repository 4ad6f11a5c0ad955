"""How a trained model's new weights reach the nodes that follow it: one module per transport, chosen
from the one table below (`transport.weights` names the policy's; another trained model, a critic,
publishes files). A `WeightUpdate` names its transport, so a follower loads any version, a resumed
checkpoint's file included, the way it was published.

May import: areal.graph, areal.engines, areal.nodes, areal.runtime.wire, areal.runtime.storage,
areal.runtime.compiler (and the leaves areal.config, areal.overrides, areal.errors).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from areal.runtime.weights import broadcast, files, shm, tcp
from areal.runtime.weights.transport import Publisher, Source, Transport
from areal.runtime.wire.security import RunKey
from areal.runtime.wire.weight_update import Via, WeightUpdate

TRANSPORTS: dict[str, Transport] = {
    files.KIND: files.TRANSPORT,
    broadcast.KIND: broadcast.TRANSPORT,
    shm.KIND: shm.TRANSPORT,
    tcp.KIND: tcp.TRANSPORT,
}


class UnknownTransport(ValueError):
    """A version sent by a transport this process does not have (a newer or mismatched areal on the other side)."""


def transport_of(via: Via) -> Transport:
    """The transport that carried `via`, or an error naming its kind and the known ones."""
    transport = TRANSPORTS.get(via.kind)
    if transport is None:
        raise UnknownTransport(f"weights came by transport {via.kind!r}, which this areal does not have "
                               f"(it has {', '.join(TRANSPORTS)})")
    return transport


def arm(key: RunKey | None, stop_asked: Callable[[], bool] | None = None) -> None:
    """The run's key, for a transport that opens sockets of its own (tcp), and how it learns, while waiting for
    the trainer, that the worker was told to stop: a worker arms it once, as it starts."""
    tcp.use_run_key(key, stop_asked)


def collective(via: Via | None) -> bool:
    """A version that travels as a collective: its followers take part when told, and only then."""
    return via is not None and transport_of(via).collective


def publisher(source: Source) -> Publisher:
    """The publisher of the trainer `source` describes, by the transport its model's weights take."""
    return TRANSPORTS[source.plan.weights_kind(source.model)].publisher(source)


def receive(update: WeightUpdate, follower: Any) -> bool:
    """Load `update` into `follower`; an update with no `via` is the weights it holds already. False when a newer
    version superseded it before it could be read: the follower holds what it held."""
    return update.via is None or transport_of(update.via).receive(update.via, follower, update.version)


__all__ = ["TRANSPORTS", "Publisher", "Source", "UnknownTransport", "Via", "WeightUpdate", "arm", "collective",
           "publisher", "receive", "transport_of"]

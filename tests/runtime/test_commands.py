"""The controller's commands: each kind crosses the control socket as the same msgpack map as before and parses
back equal; a malformed one is refused naming its kind and field; the worker carries each out through its table."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from areal.errors import WireError
from areal.runtime.weights import Via, WeightUpdate
from areal.runtime.wire.commands import (
    KINDS,
    Command,
    EndTraining,
    ForgetBelow,
    HoldWeights,
    Rewire,
    Stop,
    TakeCensus,
    parse,
)
from areal.runtime.wire.control import pack, unpack
from areal.runtime.worker.main import COMMANDS, Worker

EVERY_KIND = [  # every field away from its default
    Stop(checkpoint="/run/checkpoints/.staging-000004"),
    Rewire(channel="score", replica=1, connect="tcp://10.0.0.2:5001", disconnect="tcp://10.0.0.3:5001"),
    TakeCensus(seq=3),
    ForgetBelow(group=17),
    HoldWeights(update=WeightUpdate("actor", 5, Via("files", "/run/weights/actor/v000005.safetensors"))),
    EndTraining(),
]


def test_every_command_kind_crosses_the_wire_and_parses_back_equal():
    assert {type(c) for c in EVERY_KIND} == set(KINDS.values())
    for command in EVERY_KIND:
        assert parse(unpack(pack(command.to_wire()), "controller")) == command


def test_a_command_on_the_wire_is_a_map_with_its_type_and_the_fields_not_at_their_default():
    assert Stop().to_wire() == {"type": "stop"}
    assert Stop(checkpoint="/c").to_wire() == {"type": "stop", "checkpoint": "/c"}
    assert Rewire(channel="score", replica=0, connect="tcp://h:1").to_wire() == {
        "type": "peers", "channel": "score", "replica": 0, "connect": "tcp://h:1"}
    assert TakeCensus(seq=2).to_wire() == {"type": "census", "seq": 2}
    assert ForgetBelow(group=7).to_wire() == {"type": "frontier", "group": 7}
    assert HoldWeights(update=WeightUpdate("actor", 0)).to_wire() == {
        "type": "weights", "update": {"model": "actor", "version": 0}}  # no via: the weights it holds
    assert parse({"type": "stop"}) == Stop(checkpoint=None)


@pytest.mark.parametrize(("raw", "error"), [
    ({"type": "peers", "channel": "score", "connect": "tcp://h:1"},
     r"^command 'peers' from the controller: replica: Field required$"),
    ({"type": "weights", "update": {"model": "actor", "via": {"kind": "files"}}},
     r"^command 'weights' from the controller: update.version: Field required$"),
    ({"type": "frontier", "group": "seven"},
     r"^command 'frontier' from the controller: group: Input should be a valid integer"),
    ({"type": "stop", "checkpiont": "/c"},
     r"^command 'stop' from the controller: checkpiont: Extra inputs are not permitted$"),
    ({"type": "reboot"},
     r"^command from the controller: unknown type 'reboot' "
     r"\(known: stop, peers, census, frontier, weights, end-training\)$"),
])
def test_a_malformed_command_is_refused_naming_its_kind_and_field(raw: dict[str, Any], error: str):
    with pytest.raises(WireError, match=error):
        parse(raw)


class Inbox:
    """A worker's control socket holding the maps the controller sent."""

    def __init__(self, *raw: dict[str, Any]) -> None:
        self.raw = list(raw)

    def recv(self, timeout_ms: int = 0) -> dict[str, Any] | None:
        return self.raw.pop(0) if self.raw else None


class Join:
    def __init__(self) -> None:
        self.forgotten: list[int] = []

    def forget_below(self, group: int) -> None:
        self.forgotten.append(group)


def _worker(*raw: dict[str, Any]) -> Worker:
    """The parts of a map worker its commands touch (building a whole one loads a recipe and binds sockets)."""
    worker = object.__new__(Worker)
    worker.control = Inbox(*raw)  # type: ignore[assignment]
    worker.pool = SimpleNamespace(role="map")  # type: ignore[assignment]
    worker.join, worker.stopping, worker.census = Join(), False, None  # type: ignore[assignment]
    worker.training_ended = False
    worker._latest_weights = {}
    worker.mirror = None  # the run directory is this machine's
    return worker


def test_the_worker_has_one_handler_for_every_command_kind():
    assert set(COMMANDS) == set(KINDS.values())
    assert all(issubclass(kind, Command) for kind in COMMANDS)


def test_the_worker_carries_out_each_command_it_is_sent_in_order():
    weights = HoldWeights(update=WeightUpdate("actor", 4, Via("files", "/w/v000004.safetensors")))
    worker = _worker(TakeCensus(seq=4).to_wire(), ForgetBelow(group=9).to_wire(), weights.to_wire(),
                     EndTraining().to_wire(), Stop().to_wire())
    worker._commands()
    join = worker.join
    assert isinstance(join, Join)
    assert (worker.census, join.forgotten, worker._latest_weights) == (4, [9], {"actor": weights.update})
    assert worker.training_ended and worker.stopping


def test_a_worker_sent_a_malformed_command_stops_with_the_kind_and_field_not_a_key_error():
    worker = _worker({"type": "census"})
    with pytest.raises(WireError, match=r"^command 'census' from the controller: seq: Field required$"):
        worker._commands()

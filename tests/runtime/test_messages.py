"""The workers' messages: each kind crosses the control socket and parses back equal; a malformed one is refused
naming its sender, kind and field; the controller has a handler for every kind; a node's report is typed where it
enters the runtime."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from areal.errors import WireError
from areal.runtime.controller.controller import HANDLERS
from areal.runtime.weights import Via
from areal.runtime.wire import messages as msg
from areal.runtime.wire.control import pack, unpack
from areal.runtime.worker.context import WorkerContext

EVERY_KIND = [  # every field away from its default
    msg.Alive(),
    msg.Ready(pid=4242, endpoints={"rollout": "tcp://10.0.0.2:5001"}),
    msg.Heartbeat(busy=0.25, holding=[3, 4], batches=2, samples=8, tokens=120),
    msg.Census(seq=2, holding=[5]),
    msg.Stopped(batches=3, samples=12, tokens=300),
    msg.VersionPublished(model="actor", version=3, via=Via("files", "/w/actor/v000003.safetensors"),
                         stats={"loss": 0.5}, staleness={"0": 4, "1": 2}, groups=[6, 7], next_group=8,
                         sample_ids=[60, 61], rewards=[1.0, 0.0], solved=[True, False], tokens=42),
    msg.SamplesFailed(node="score", sample_ids=[1, 2], reasons=["timeout", "boom"], eval=True),
    msg.SamplesFiltered(node="keep_mixed", sample_ids=[3], reasons=["all rewards equal"]),
    msg.SamplesDropped(node="rollout", sample_ids=[4], tokens=[17], reason="older than η=1"),
    msg.GroupsRecycled(node="rollout", version=4, groups=[3, 5], tokens=[40, 0]),
    msg.SamplesNoted(node="rollout", sample_ids=[5], reasons=["length"]),
    msg.HeldOutScored(round=1, task_ids=["t1"], rewards=[1.0], solved=[True], sample_ids=[900]),
    msg.CheckpointWritten(model="actor", version=4, path="/run/checkpoints/.staging", next_group=9, consumed=[11]),
    msg.FileWritten(path="samples/rollout[0].jsonl", data=b'{"sample_id": 3}\n', fresh=True),
    msg.DuplicateDropped(group=7),
    msg.BatchRefused(groups=[8], reason="header says int64[4]"),
    msg.NodeMetrics(values={"score/mean": 0.5}),
    msg.WorkerError(node="score", message="node 'score' raised", traceback="Traceback ...", fatal=True),
    msg.TrainingEnded(model="actor", version=7),
]


def test_every_message_kind_crosses_the_wire_and_parses_back_equal():
    assert {type(m) for m in EVERY_KIND} == set(msg.KINDS.values())
    for message in EVERY_KIND:
        assert msg.parse(unpack(pack(message.to_wire()), "score[0]"), "score[0]") == message


def test_a_message_on_the_wire_is_a_map_with_its_type_and_the_fields_not_at_their_default():
    assert msg.Heartbeat(busy=0.5).to_wire() == {"type": "heartbeat", "busy": 0.5}
    assert msg.SamplesFailed(node="score", sample_ids=[1], reasons=["boom"]).to_wire() == {
        "type": "failed", "node": "score", "sample_ids": [1], "reasons": ["boom"]}
    assert msg.Alive().to_wire() == {"type": "pulse"}
    assert msg.parse({"type": "heartbeat"}, "score[0]") == msg.Heartbeat(busy=0.0, holding=[], batches=0)


@pytest.mark.parametrize(("raw", "error"), [
    ({"type": "failed", "node": "score", "sample_ids": [1]},
     r"^control message 'failed' from score\[0\]: reasons: Field required$"),
    ({"type": "version", "model": "actor", "version": "three"},
     r"^control message 'version' from score\[0\]: version: Input should be a valid integer"),
    ({"type": "hello"}, r"^control message from score\[0\]: unknown type 'hello' \(known: pulse, ready, heartbeat"),
])
def test_a_malformed_message_is_refused_naming_its_sender_kind_and_field(raw: dict[str, Any], error: str):
    with pytest.raises(WireError, match=error):
        msg.parse(raw, "score[0]")


def test_the_controller_has_one_handler_for_every_message_kind():
    assert set(HANDLERS) == set(msg.KINDS.values())


class Outbox:
    """A worker's control socket, keeping what was sent on it."""

    def __init__(self) -> None:
        self.sent: list[msg.Message] = []

    def send(self, message: msg.Message) -> None:
        self.sent.append(message)


def _context(control: Outbox) -> WorkerContext:
    pool = SimpleNamespace(name="rollout")
    return WorkerContext(None, None, pool, 0, "rollout", 0, None, control)  # type: ignore[arg-type]


def test_a_nodes_report_is_sent_as_its_message_tagged_with_the_node():
    control = Outbox()
    _context(control).report("noted", sample_ids=[5, 6], reasons=["length", "empty"])
    assert control.sent == [msg.SamplesNoted(node="rollout", sample_ids=[5, 6], reasons=["length", "empty"])]


def test_a_malformed_report_fails_in_the_node_naming_its_kind_and_field_and_sends_nothing():
    control = Outbox()
    with pytest.raises(WireError, match=r"^control message 'noted' from rollout\[0\]: reasons: Field required$"):
        _context(control).report("noted", sample_ids=[5])
    assert control.sent == []

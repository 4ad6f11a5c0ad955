"""transport.weights=tcp: a follower fetches exactly the tensors the trainer published, every dtype and shape; the
trainer keeps only the versions a follower may still ask for and says which is newest; a client without the run's
key is answered nothing; a trainer that does not answer is an error naming it, and a follower told to stop while it
waits gives up at once, keeping what it holds. Everything on 127.0.0.1."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch
import zmq

from areal.errors import RunError
from areal.runtime.weights import TRANSPORTS, Via, arm
from areal.runtime.weights.tcp import KIND, TcpPublisher, fetch, receive
from areal.runtime.weights.transport import Source
from areal.runtime.wire.security import RunKey


def _source(weights: dict, keep_lag: int = 0) -> Source:
    config = SimpleNamespace(sampling_lag=keep_lag, transport=SimpleNamespace(host="127.0.0.1"))
    return Source(model="actor", plan=SimpleNamespace(run_dir="unused"), config=config, rank_follower=False,
                  gather=lambda: weights, save=lambda path: None)


class _Follower:
    def __init__(self) -> None:
        self.loaded: dict[int, dict[str, torch.Tensor]] = {}

    def load_weights(self, weights, version):
        self.loaded[version] = {k: t.clone() for k, t in weights.items()}  # a model copies what it reads


@pytest.fixture
def unarmed():
    arm(None)
    yield
    arm(None)


def test_the_follower_gets_exactly_the_tensors_the_trainer_published(unarmed):
    weights = {"embed": torch.randn(7, 5), "norm": torch.randn(3).to(torch.bfloat16), "step": torch.tensor(4),
               "ids": torch.arange(5, dtype=torch.int64), "empty": torch.zeros(0, 4),
               "mask": torch.tensor([True, False]), "half": torch.randn(2, 3).to(torch.float16)}
    publisher = TcpPublisher(_source(weights))
    try:
        via = publisher.publish(1)
        assert via is not None and via.kind == KIND and via.where.startswith("tcp://127.0.0.1:")
        assert TRANSPORTS[KIND].receive is receive and not TRANSPORTS[KIND].one_host
        follower = _Follower()
        assert receive(via, follower, 1)
        got = follower.loaded[1]
        assert list(got) == list(weights)
        assert all(got[k].dtype == t.dtype and got[k].shape == t.shape and torch.equal(got[k], t)
                   for k, t in weights.items())
        weights["embed"].add_(1.0)  # the engine's next step: what was published stays as it was
        assert torch.equal(fetch(via.where, 1)["embed"], got["embed"])
        total = sum(t.numel() * t.element_size() for t in weights.values())
        assert publisher.sent_bytes() == 2 * total  # two fetches of version 1: the step records' weights_sent_mib
    finally:
        publisher.close()


def test_the_trainer_keeps_the_newest_versions_and_a_superseded_one_is_skipped(unarmed):
    publisher = TcpPublisher(_source({"w": torch.ones(3)}, keep_lag=1))  # keeps 3 + 1
    try:
        vias = {v: publisher.publish(v) for v in range(1, 8)}
        assert sorted(publisher.versions) == [4, 5, 6, 7]
        follower = _Follower()
        assert not receive(vias[2], follower, 2)  # gone, v7 is newer: its update follows
        assert follower.loaded == {}
        with pytest.raises(RunError, match=r"weights v9: the trainer at tcp://127\.0\.0\.1:\d+ does not hold it "
                                           r"\(newest: v7\)"):
            fetch(vias[7].where, 9)
    finally:
        publisher.close()


def test_a_client_without_the_runs_key_is_answered_nothing(unarmed):
    arm(RunKey.create())
    publisher = TcpPublisher(_source({"w": torch.ones(3)}))
    try:
        via = publisher.publish(1)
        assert torch.equal(fetch(via.where, 1)["w"], torch.ones(3))  # armed with the run's key: served
        arm(RunKey.create())  # another run's key
        with pytest.raises(RunError, match=r"did not answer within 1 s"):
            fetch(via.where, 1, timeout_s=1.0)
        arm(None)  # no key at all
        with pytest.raises(RunError, match=r"did not answer within 1 s"):
            fetch(via.where, 1, timeout_s=1.0)
    finally:
        publisher.close()


def test_a_trainer_that_does_not_answer_is_named(unarmed):
    silent = zmq.Context.instance().socket(zmq.ROUTER)
    try:
        silent.bind("tcp://127.0.0.1:*")
        endpoint = silent.getsockopt_string(zmq.LAST_ENDPOINT)
        with pytest.raises(RunError, match=rf"weights v3: the trainer at {endpoint} did not answer within 1 s"):
            fetch(endpoint, 3, timeout_s=1.0)
    finally:
        silent.close(linger=0)


def test_a_closed_publisher_stops_serving_and_frees_its_versions(unarmed):
    publisher = TcpPublisher(_source({"w": torch.ones(3)}))
    via = publisher.publish(1)
    publisher.close()
    assert publisher.versions == {} and not publisher._thread.is_alive()
    with pytest.raises(RunError, match="did not answer"):
        fetch(via.where, 1, timeout_s=0.5)


def test_a_follower_told_to_stop_while_the_trainer_is_silent_gives_up_at_once_and_keeps_its_weights(unarmed):
    looks = []

    def stop_asked() -> bool:  # the worker's commands: a Stop arrives at the third look
        looks.append(1)
        return len(looks) >= 3

    silent = zmq.Context.instance().socket(zmq.ROUTER)  # a trainer on a lost node: nothing answers
    try:
        silent.bind("tcp://127.0.0.1:*")
        endpoint = silent.getsockopt_string(zmq.LAST_ENDPOINT)
        arm(None, stop_asked)
        follower = _Follower()
        start = time.monotonic()
        assert not receive(Via(KIND, endpoint), follower, 3)  # not loaded: the follower holds what it held
        assert follower.loaded == {} and len(looks) == 3
        assert time.monotonic() - start < 5.0  # not the 300 s a silent trainer is otherwise given
    finally:
        silent.close(linger=0)

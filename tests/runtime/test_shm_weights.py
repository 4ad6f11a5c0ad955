"""transport.weights=shm: the tensors a trainer writes are the ones a follower maps, every dtype and shape; the
trainer keeps only the versions a follower may still ask for; and no segment of a run is left in /dev/shm after
the run, nor after its trainer is killed. Segments are counted by the run's own name prefix only."""

from __future__ import annotations

import errno
import os
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from areal.cli.run import build_controller
from areal.errors import RunError
from areal.runtime.weights import TRANSPORTS
from areal.runtime.weights.shm import KIND, ShmPublisher, receive, segment_prefix
from areal.runtime.weights.transport import Source

SHM = Path("/dev/shm")
pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="POSIX shared memory is listed in /dev/shm on Linux only")
RECIPE = Path(__file__).with_name("fake_rl.py")
EXIT_TIMEOUT_S = 30


def _segments(run_dir: Path) -> list[str]:
    return sorted(p.name for p in SHM.iterdir() if p.name.startswith(segment_prefix(run_dir)))


def _source(run_dir: Path, weights: dict, keep_lag: int = 0) -> Source:
    plan = SimpleNamespace(run_dir=str(run_dir))
    return Source(model="actor", plan=plan, config=SimpleNamespace(sampling_lag=keep_lag), rank_follower=False,
                  gather=lambda: weights, save=lambda path: None)


class _Follower:
    def __init__(self) -> None:
        self.loaded: dict[int, dict[str, torch.Tensor]] = {}

    def load_weights(self, weights, version):
        self.loaded[version] = {k: t.clone() for k, t in weights.items()}  # a model copies what it maps


def test_the_follower_maps_exactly_the_tensors_the_trainer_wrote(tmp_path):
    weights = {"embed": torch.randn(7, 5), "norm": torch.randn(3).to(torch.bfloat16), "step": torch.tensor(4),
               "ids": torch.arange(5, dtype=torch.int64), "empty": torch.zeros(0, 4),
               "mask": torch.tensor([True, False])}
    publisher = ShmPublisher(_source(tmp_path, weights))
    via = publisher.publish(1)
    assert via is not None and via.kind == KIND and TRANSPORTS[KIND].receive is receive
    follower = _Follower()
    receive(via, follower, 1)
    got = follower.loaded[1]
    assert list(got) == list(weights)
    assert all(got[k].dtype == t.dtype and got[k].shape == t.shape and torch.equal(got[k], t)
               for k, t in weights.items())
    assert _segments(tmp_path) == [via.where]  # a follower maps it and leaves it for the others
    publisher.close()
    assert _segments(tmp_path) == []
    with pytest.raises(RunError, match=rf"shared-memory weights {via.where}: no such segment on this machine"):
        receive(via, follower, 1)


def test_the_trainer_keeps_the_newest_versions_a_follower_may_ask_for(tmp_path):
    publisher = ShmPublisher(_source(tmp_path, {"w": torch.ones(3)}, keep_lag=1))  # keep 3 + 1
    names = {v: publisher.publish(v) for v in range(1, 8)}
    assert _segments(tmp_path) == sorted(names[v].where for v in (4, 5, 6, 7))
    publisher.close()
    assert _segments(tmp_path) == []


def test_a_segment_unlinked_because_newer_versions_came_is_skipped_and_one_gone_for_no_reason_is_an_error(tmp_path):
    publisher = ShmPublisher(_source(tmp_path, {"w": torch.ones(3)}))  # keeps 3
    names = {v: publisher.publish(v) for v in range(1, 6)}
    follower = _Follower()
    # a slow follower told of v2 after the trainer had published v5 and unlinked v2: it keeps what it holds
    assert receive(names[2], follower, 2) is False and follower.loaded == {}
    assert receive(names[5], follower, 5) is True and list(follower.loaded) == [5]
    publisher.close()
    with pytest.raises(RunError, match="no such segment"):  # nothing newer left: the segment is missing
        receive(names[2], follower, 2)


TRAINER = """
import sys, torch
from types import SimpleNamespace
from areal.runtime.weights.shm import ShmPublisher
from areal.runtime.weights.transport import Source
source = Source(model="actor", plan=SimpleNamespace(run_dir=sys.argv[1]), config=SimpleNamespace(sampling_lag=0),
                rank_follower=False, gather=lambda: {"w": torch.ones(1000)}, save=lambda path: None)
publisher = ShmPublisher(source)
publisher.publish(1), publisher.publish(2)
print(publisher.watcher.pid, flush=True)
sys.stdin.read()  # until the test kills it
"""


def test_a_killed_trainer_leaves_no_segment(tmp_path):
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(tmp_path)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert trainer.stdout is not None
        watcher = int(trainer.stdout.readline())
        assert len(_segments(tmp_path)) == 2
        exited = os.pidfd_open(watcher)  # the watcher is not our child: wait on its pidfd for it to end
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(EXIT_TIMEOUT_S)
    try:
        assert select.select([exited], [], [], EXIT_TIMEOUT_S)[0] == [exited]
    finally:
        os.close(exited)
    assert _segments(tmp_path) == []


def test_a_run_with_weights_in_shared_memory_trains_every_version_and_leaves_no_segment(tmp_path):
    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    controller = build_controller(recipe, ["transport.weights=shm", "mode=lagged", "staleness=2", "steps=6",
                                           "batch_size=2", "group_size=2"], tmp_path / "run")
    controller.run()
    trained = [line for line in (tmp_path / "run" / "trained.jsonl").read_text().splitlines()]
    assert len(trained) == 6  # the fake generator refuses weights of another version than it is told
    assert controller.state.version == 6
    assert _segments(Path(controller.plan.run_dir)) == []
    assert not (tmp_path / "run" / "weights" / "actor").exists()  # nothing went through files



def test_a_full_dev_shm_is_said_with_its_size_and_the_ways_on_and_the_torn_segment_goes(tmp_path, monkeypatch):
    from areal.runtime.weights import shm

    publisher = ShmPublisher(_source(tmp_path, {"w": torch.ones(2**18)}))  # 1 MB a version
    first = publisher.publish(1).where
    written = shm.write

    def full(name, weights):  # the segment is made, then the tmpfs runs out of room while it is filled
        written(name, weights)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(shm, "write", full)
    try:
        said = (r"^transport.weights=shm: no room in /dev/shm \(\d+ MB, [\d.]+ MB free\) for version 2's weights "
                r"\(1.0 MB; the newest 3 versions are kept there\): give it more \(docker run --shm-size=...\), or "
                r"use transport.weights=files")
        with pytest.raises(RunError, match=said):
            publisher.publish(2)
        assert _segments(tmp_path) == [first]  # the torn one is gone, the last whole one stays for the followers
    finally:
        publisher.close()

"""Episodes in the real runtime: a two-turn agent trains within η, and a worker killed mid-episode re-runs that
episode once, with every sample trained exactly once."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from areal.cli.run import build_controller
from tests.local_model import make_checkpoint

RECIPE = Path(__file__).with_name("episode_rl.py")
B, G, STEPS = 2, 3, 6


def _run(tmp_path: Path, monkeypatch, *overrides: str):
    monkeypatch.setenv("EPISODE_LOG", str(tmp_path))
    model = make_checkpoint(tmp_path / "ckpt")
    controller = build_controller(RECIPE, [f"model={model}", *overrides], tmp_path / "run")
    controller.run()
    return controller


def _records(controller, kind: str) -> list[dict]:
    lines = (Path(controller.plan.run_dir) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def _trained_once(controller) -> None:
    """The accounting saw every admitted sample trained exactly once (none failed, none dropped as a duplicate
    of one trained already), and the staleness of every trained episode within η = 1."""
    steps = _records(controller, "step")
    end = steps[-1]
    assert [s["version"] for s in steps] == list(range(1, STEPS + 1))
    assert end["trained"] == STEPS * B * G and end["failed"] == 0
    assert end["started"] == end["trained"] + end["in_flight"]
    assert sum(s["samples"] for s in steps) == STEPS * B * G
    assert max(int(lag) for s in steps for lag in s["staleness"]) <= 1


def test_a_two_turn_episode_trains_every_sample_once_within_eta(tmp_path, monkeypatch):
    controller = _run(tmp_path, monkeypatch)
    _trained_once(controller)
    log = [line.split() for line in (tmp_path / "log").read_text().splitlines()]
    ends = Counter(int(sid) for kind, sid, _ in log if kind == "end")
    assert all(ends[sid] == 1 for sid in range(STEPS * B * G))  # both turns ran, once, for every trained sample


def test_a_worker_killed_mid_episode_reruns_that_episode_once_and_trains_each_sample_once(tmp_path, monkeypatch):
    victim = 7  # group 2's second episode: it kills its worker between its two turns
    monkeypatch.setenv("EPISODE_KILL_AT", str(victim))
    controller = _run(tmp_path, monkeypatch)
    killed = int((tmp_path / "killed").read_text())
    _trained_once(controller)
    log = [line.split() for line in (tmp_path / "log").read_text().splitlines()]
    starts = [int(pid) for kind, sid, pid in log if kind == "start" and int(sid) == victim]
    ends = [int(pid) for kind, sid, pid in log if kind == "end" and int(sid) == victim]
    assert starts[0] == killed and len(starts) == 2 and starts[1] != killed  # started, killed, re-run once
    assert len(ends) == 1 and ends[0] != killed  # it finished once, in the new worker
    restarts = _records(controller, "restart")
    assert [r["worker"] for r in restarts] == ["writer[0]"] and "exited with code -9" in restarts[0]["why"]

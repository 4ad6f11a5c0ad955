"""transport.weights=shm keeps each version on the trainer's machine: a follower that lands on another host is
refused, naming the setting, the model, the follower's pool and nodes, and both hosts; followers on the
trainer's host, or weights that travel as files, are accepted."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from areal.cli.run import build_controller
from areal.errors import ConfigError
from areal.graph.recipe import load_recipe
from areal.runtime.compiler.compile import compile_plan
from areal.runtime.weights.hosts import misplaced

RECIPE = Path(__file__).with_name("fake_rl.py")  # pools: rollout (nodes rollout, advantage) ⇢ actor


def _plan(tmp_path: Path, weights: str):
    recipe = load_recipe(RECIPE, [f"transport.weights={weights}", "placement.rollout=2"])
    return compile_plan(recipe.graph, recipe.config, run_dir=tmp_path / "run")


def test_a_follower_on_another_host_than_its_shm_trainer_is_named_with_both_hosts(tmp_path):
    plan = _plan(tmp_path, "shm")
    landed = [("rollout", 0, "10.0.0.1"), ("rollout", 1, "10.0.0.2"), ("actor", 0, "10.0.0.1")]
    assert misplaced(plan, landed) == [
        "transport.weights=shm: model 'actor' is trained on host 10.0.0.1 (actor[0]), but rollout[1] "
        "(node 'rollout', 'advantage'), which follows it, runs on host 10.0.0.2"]


def test_followers_on_the_trainers_host_or_weights_as_files_are_accepted(tmp_path):
    plan = _plan(tmp_path, "shm")
    assert misplaced(plan, [("rollout", 0, "10.0.0.1"), ("rollout", 1, "10.0.0.1"), ("actor", 0, "10.0.0.1")]) == []
    assert misplaced(plan, [("rollout", 0, "10.0.0.2")]) == []  # the trainer has not landed yet
    plan = _plan(tmp_path, "files")
    assert misplaced(plan, [("rollout", 0, "10.0.0.2"), ("actor", 0, "10.0.0.1")]) == []


@dataclass
class _Landed:
    """A started worker as a launcher reports it: where it runs, and already ended (nothing to stop)."""

    node: str
    pid: int = 0

    @property
    def host(self) -> str:
        return self.node

    def waiting(self) -> None:
        return None

    def poll(self) -> int:
        return 0

    def kill(self) -> None:
        pass


class _TwoHosts:
    """A launcher that puts the trainer on one host and every generator replica on another."""

    def start(self, spec):
        return _Landed("10.0.0.1" if spec.pool == "actor" else "10.0.0.2")


def test_a_run_whose_launcher_puts_the_shm_trainer_apart_from_its_generators_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr("areal.runtime.controller.controller.launcher_for", lambda cluster, plan: _TwoHosts())
    controller = build_controller(RECIPE, ["transport.weights=shm", "steps=1"], tmp_path / "run")
    with pytest.raises(ConfigError, match=r"(?s)transport\.weights=shm: model 'actor' is trained on host 10\.0\.0\.1 "
                                          r"\(actor\[0\]\), but rollout\[0\] .* runs on host 10\.0\.0\.2.*"
                                          r"shared memory does not cross machines"):
        controller.run()
    assert controller.state.version == 0

"""What each follower of a trained model is told to hold: after a resume, every model's trained weights, not
only the policy's; and never a version past 0 without a file to load it from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from areal.errors import RunError
from areal.graph.recipe import load_recipe
from areal.runtime.compiler.compile import compile_plan
from areal.runtime.storage.checkpoint import policy_name
from areal.runtime.weights.versions import Versions

ACTOR_CRITIC = Path(__file__).resolve().parents[2] / "recipes" / "actor_critic.py"


@dataclass
class Follower:
    worker_id: str
    pool: str


def _plan(tmp_path: Path):
    recipe = load_recipe(ACTOR_CRITIC, ["batch_size=2", "group_size=2"])
    return compile_plan(recipe.graph, recipe.config, run_dir=tmp_path / "run")


def _told(versions: Versions, worker: Follower) -> dict:
    sent: list[dict] = []
    versions.catch_up(worker, lambda to, command: sent.append({"to": to, **command.to_wire()}))  # as on the wire
    return sent[0]


def test_a_resumed_run_tells_the_critics_followers_the_checkpoints_critic(tmp_path):
    plan = _plan(tmp_path)
    checkpoint = tmp_path / "run" / "checkpoints" / "step-000002"
    checkpoint.mkdir(parents=True)
    for model in ("actor", "critic"):
        (checkpoint / policy_name(model)).write_bytes(b"weights")
    versions = Versions(plan, start=2, sampling_lag=0, resumed=checkpoint)
    values = plan.pool_of("values").name
    assert _told(versions, Follower(f"{values}[0]", values)) == {
        "to": f"{values}[0]", "type": "weights", "update": {
            "model": "critic", "version": 2,
            "via": {"kind": "files", "where": str(checkpoint / "policy-critic.safetensors")}}}
    rollout = plan.pool_of("rollout").name
    told = _told(versions, Follower(f"{rollout}[0]", rollout))["update"]["via"]
    assert told == {"kind": "files", "where": str(checkpoint / "policy-actor.safetensors")}


def test_a_follower_told_a_trained_version_with_no_file_to_load_stops_the_run_naming_the_model(tmp_path):
    plan = _plan(tmp_path)
    empty = tmp_path / "run" / "checkpoints" / "step-000002"
    empty.mkdir(parents=True)  # a checkpoint without the critic's weights
    (empty / policy_name("actor")).write_bytes(b"weights")
    versions = Versions(plan, start=2, sampling_lag=0, resumed=empty)
    values = plan.pool_of("values").name
    with pytest.raises(RunError, match=rf"model 'critic' is at version 2, but no file holds those weights.*"
                                       rf"{values}\[0\] would run on weights it was not told to hold"):
        _told(versions, Follower(f"{values}[0]", values))
    fresh = Versions(plan, start=0, sampling_lag=0)
    assert "via" not in _told(fresh, Follower(f"{values}[0]", values))["update"]  # v0: the weights it is built with

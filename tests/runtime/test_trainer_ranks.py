"""A trainer of two data-parallel ranks (FSDP on gloo) inside a real run, with weights as files or
broadcast over the weights group: the same training as one process, and checkpoints to resume from."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from areal.cli.run import run_recipe
from areal.config import RunConfig
from areal.errors import ConfigError
from areal.overrides import apply_overrides
from areal.runtime.compiler.plan import Plan
from tests.local_model import make_checkpoint

TINY_RL = Path(__file__).with_name("tiny_rl.py")  # a real model in sync mode, a checkpoint every 2 steps
TOL = 1e-6  # float32; only the order of the gradient sums differs between one process and two ranks


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / f"step-{step:06d}" / "trainer-actor" / "model" / "model.safetensors")


def _steps(run: Path) -> list[dict]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == "step"]


def _rewards(run: Path) -> list[float]:
    return [r["reward_mean"] for r in _steps(run)]


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Over a's weights (FSDP's full state dict also names the tied head, which one process writes once)."""
    assert a.keys() <= b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ranks")
    model = make_checkpoint(tmp / "ckpt")
    # one sequence at a time, so each sample's numbers do not depend on its neighbours in a decode batch
    common = [f"model={model}", "generation.max_batch=1", "steps=4", "checkpoint.keep=3"]
    ranks = ["trainer.engine=fsdp", "trainer.ranks=2"]
    runs = {"model": model, "one": tmp / "one", "two": tmp / "two", "broadcast": tmp / "broadcast"}
    for name, extra in (("one", []), ("two", ranks), ("broadcast", [*ranks, "transport.weights=broadcast"])):
        assert run_recipe(TINY_RL, overrides=[*common, *extra], run_dir=runs[name], live=False) == 0
    return runs


def test_two_trainer_ranks_train_as_one_process_does(runs):
    plan = Plan.from_json((runs["two"] / "plan.json").read_text())
    actor = plan.pool("actor")
    assert actor.replicas == 2 and actor.rendezvous
    assert all(len(c.endpoints) == 1 for c in plan.inputs_of("actor"))  # rank 0 receives for both
    assert (runs["two"] / "logs" / "actor-1.log").exists()
    assert _rewards(runs["one"]) == _rewards(runs["two"])  # the same samples were drawn, step by step
    one, two = _weights(runs["one"], 4), _weights(runs["two"], 4)
    start = load_file(runs["model"] / "model.safetensors")
    assert _max_diff(one, start) > 100 * TOL  # the updates moved the weights
    assert _max_diff(one, two) < TOL


def test_both_ranks_resume_from_a_checkpoint_rank_0_wrote(runs, tmp_path):
    cut = tmp_path / "cut"
    shutil.copytree(runs["two"], cut, ignore=shutil.ignore_patterns("sockets"))
    shutil.rmtree(cut / "checkpoints" / "step-000004")
    assert run_recipe(TINY_RL, resume=cut, live=False) == 0
    assert _rewards(cut)[-2:] == _rewards(runs["two"])[-2:]  # steps 3 and 4 again, on the same samples
    assert _max_diff(_weights(cut, 4), _weights(runs["two"], 4)) < TOL


def test_weights_broadcast_to_the_generator_train_as_weights_through_files_do(runs):
    run = runs["broadcast"]
    assert _rewards(run) == _rewards(runs["one"])
    # sync mode: every sample was drawn with the weights the trainer then starts from, so π_prox = π_behav
    assert all(abs(r["importance_weight_max"] - 1) < 1e-5 for r in _steps(run)), _steps(run)
    assert _max_diff(_weights(runs["one"], 4), _weights(run, 4)) < TOL
    assert not (run / "weights").exists()  # nothing went through the disk
    policy = load_file(run / "checkpoints" / "step-000004" / "policy-actor.safetensors")  # for export and resume
    assert _max_diff(policy, _weights(run, 4)) == 0


def test_a_broadcast_run_resumes_and_the_generator_starts_from_the_trainers_weights(runs, tmp_path):
    cut = tmp_path / "cut"
    shutil.copytree(runs["broadcast"], cut, ignore=shutil.ignore_patterns("sockets"))
    shutil.rmtree(cut / "checkpoints" / "step-000004")
    assert run_recipe(TINY_RL, resume=cut, live=False) == 0
    assert _rewards(cut)[-2:] == _rewards(runs["broadcast"])[-2:]
    assert _max_diff(_weights(cut, 4), _weights(runs["broadcast"], 4)) < TOL


def test_lagged_mode_needs_weights_as_files():
    with pytest.raises(ConfigError, match="mode=lagged samples from older policies"):
        apply_overrides(RunConfig(), ["mode=lagged", "transport.weights=broadcast"])


def test_more_than_one_rank_needs_the_fsdp_engine():
    with pytest.raises(ConfigError, match=r"trainer: .*ranks=2 trains data-parallel, which needs engine=fsdp"):
        apply_overrides(RunConfig(), ["trainer.ranks=2"])

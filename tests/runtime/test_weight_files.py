"""The weights files a trainer publishes are found again, by the same name, by its followers, the
controller's version table and the checkpoint."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from areal.graph.recipe import load_recipe
from areal.runtime import weights
from areal.runtime.compiler.compile import compile_plan
from areal.runtime.storage import weight_files
from areal.runtime.storage.checkpoint import Sealing, final_dir, policy_name, staging_dir
from areal.runtime.weights import Via, WeightUpdate
from areal.runtime.weights.files import FilesPublisher
from areal.runtime.weights.transport import Source
from areal.runtime.weights.versions import Versions
from areal.runtime.worker.context import WorkerContext

ACTOR_CRITIC = Path(__file__).resolve().parents[2] / "recipes" / "actor_critic.py"


def test_a_published_name_reads_back_as_its_version(tmp_path):
    for version in (0, 7, 999_999, 1_234_567):
        path = weight_files.published(tmp_path, "actor", version)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"w")
    weight_files.partial(tmp_path, "actor", 8).write_bytes(b"half")  # being written: not a version yet
    (tmp_path / "actor" / "vnotes.safetensors").write_bytes(b"?")
    found = weight_files.published_versions(tmp_path, "actor")
    assert found == {v: weight_files.published(tmp_path, "actor", v) for v in (0, 7, 999_999, 1_234_567)}
    assert weight_files.published_versions(tmp_path, "critic") == {}
    assert weight_files.published_since(weight_files.published(tmp_path, "actor", 7)) == [999_999, 1_234_567]
    assert weight_files.published_since(weight_files.published(tmp_path, "actor", 1_234_567)) == []
    with pytest.raises(ValueError, match="not a published weights file"):
        weight_files.published_since(weight_files.partial(tmp_path, "actor", 8))


class _Trainer:
    def __init__(self) -> None:
        self.version = 0

    def save_weights(self, path: str) -> None:
        Path(path).write_bytes(f"weights of v{self.version}".encode())


def _publish(plan, trainer_pool, version: int, trainer: _Trainer) -> str:
    """The trainer worker's own publishing code (the files transport's publisher) on a trainer that writes text."""
    trainer.version = version
    source = Source(model=trainer_pool.name, plan=plan, config=SimpleNamespace(sampling_lag=0), rank_follower=False,
                    gather=dict, save=trainer.save_weights)
    via = FilesPublisher(source).publish(version)
    assert via is not None
    return via.where


def test_the_trainer_the_followers_the_version_table_and_the_checkpoint_name_the_same_file(tmp_path):
    recipe = load_recipe(ACTOR_CRITIC, ["batch_size=2", "group_size=2"])
    plan = compile_plan(recipe.graph, recipe.config, run_dir=tmp_path / "run")
    actor = next(p for p in plan.trainer_pools() if p.name == "actor")
    trainer = _Trainer()
    paths = {version: _publish(plan, actor, version, trainer) for version in range(1, 6)}

    kept = weight_files.published_versions(plan.weights_dir, "actor")
    assert sorted(kept) == [3, 4, 5]  # the trainer keeps the newest 3 (no sampling lag)

    rollout = plan.pool_of("rollout")
    assert rollout.model == "actor"
    follower = WorkerContext(recipe.config, plan, rollout, 0, "rollout", 5, None, None)
    assert follower.published_weights(5) == Path(paths[5])
    assert follower.published_weights(4).read_bytes() == b"weights of v4"

    versions = Versions(plan, start=0, sampling_lag=0)
    versions.record("actor", 5, Via("files", paths[5]))
    assert versions.update("actor", 4).via == Via("files", paths[4])  # an older version is found on disk by its name

    sealing = Sealing(Path(plan.run_dir), Path(plan.weights_dir), ["actor"], keep=2)
    staged = staging_dir(plan.run_dir, 5, tag="interval")
    staged.mkdir(parents=True)
    sealing.part_written(str(staged), "actor", 5, next_group=3, consumed=[], state_at=lambda group: {})
    assert (final_dir(plan.run_dir, 5) / policy_name("actor")).read_bytes() == b"weights of v5"


def test_weights_sent_by_a_transport_this_process_lacks_are_refused_naming_it_and_the_known_ones():
    update = weights.WeightUpdate(model="actor", version=3, via=weights.Via("rdma", "qp-7"))
    with pytest.raises(weights.UnknownTransport, match=r"'rdma'.*\(it has files, broadcast, shm, tcp\)"):
        weights.receive(update, follower=None)
    with pytest.raises(weights.UnknownTransport, match="'rdma'"):
        weights.collective(update.via)


class _Holder:
    def __init__(self) -> None:
        self.loaded: list[int] = []

    def load_weights(self, state: dict, version: int) -> None:
        self.loaded.append(version)


def test_a_file_pruned_because_newer_versions_came_is_skipped_and_one_gone_for_no_reason_is_an_error(tmp_path):
    def update(version: int) -> WeightUpdate:
        return WeightUpdate("actor", version, Via("files", str(weight_files.published(tmp_path, "actor", version))))

    newest = weight_files.published(tmp_path, "actor", 5)
    newest.parent.mkdir(parents=True)
    save_file({"w": torch.zeros(1)}, str(newest))
    holder = _Holder()
    # a slow follower told of v2 after the trainer had published v5 and pruned v2: it keeps what it holds
    assert weights.receive(update(2), holder) is False and holder.loaded == []
    with pytest.raises(FileNotFoundError):  # nothing newer on disk: the file is missing, which is an error
        weights.receive(update(6), holder)
    assert weights.receive(update(5), holder) is True and holder.loaded == [5]

"""Helpers for the episode runner's tests: a runner on a small local checkpoint, driven step by step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from areal.config import RunConfig
from areal.graph.batch import Batch
from areal.graph.meta import GroupMeta
from areal.nodes.episodes.worker import EpisodeRunner, local_runner
from areal.nodes.workers.policy import save_weights
from tests.local_model import make_checkpoint


def runner_on(tmp_path: Path, run: Any, *, outputs: dict | None = None, endpoint: bool = False,
              timeout_s: float | None = None, **config: Any) -> EpisodeRunner:
    """An episode runner set up as its worker would, on a random 1-layer model (seed 0) at version 0."""
    checkpoint = tmp_path / "ckpt"
    if not checkpoint.exists():
        make_checkpoint(checkpoint)
    settings = {"model": str(checkpoint), "group_size": 1, "generation": {"max_new_tokens": 8, "stop": []}}
    cfg = RunConfig.model_validate({**settings, **config})
    reports: list = []
    runner = local_runner(run, cfg, outputs=outputs, endpoint=endpoint, timeout_s=timeout_s,
                          report=lambda kind, **fields: reports.append((kind, fields)))
    runner.reports = reports  # type: ignore[attr-defined]
    return runner


def weights_file(tmp_path: Path, seed: int) -> Path:
    """The state dict of another random model of the same shape: a 'new version' of the policy."""
    folder = make_checkpoint(tmp_path / f"ckpt-{seed}", seed=seed)
    path = tmp_path / f"v-{seed}.safetensors"
    model = AutoModelForCausalLM.from_pretrained(folder)
    save_weights(model.state_dict(), str(path))
    return path


def group(prompts: list[str], group_id: int = 0, samples: int = 1, **fields: list) -> tuple[Batch, GroupMeta]:
    ids = torch.arange(group_id, group_id + len(prompts))
    batch = Batch({"prompt": prompts, **fields, "group_id": ids, "sample_id": ids.clone()})
    return batch, GroupMeta(group=group_id, samples=samples, admitted_at=0)


def run_all(runner: EpisodeRunner, max_steps: int = 10_000) -> list[tuple[Batch, GroupMeta]]:
    done: list[tuple[Batch, GroupMeta]] = []
    for _ in range(max_steps):
        if not runner.pending():
            return done
        done += runner.step()
    raise AssertionError(f"episodes still running after {max_steps} steps")


def token_logprobs(checkpoint_or_weights: tuple[Path, Path | None], ids: list[int]) -> list[float]:
    """log π(ids[t] | ids[:t]) for t >= 1 under the model, at temperature 1."""
    from safetensors.torch import load_file

    folder, weights = checkpoint_or_weights
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    if weights is not None:
        model.load_state_dict(load_file(str(weights)))
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)
    return logp.tolist()

"""Shared by the model-holding nodes: load the run's policy and turn tokens into fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from areal.config import RunConfig


def load_run_policy(config: RunConfig, resume_dir: Path | None) -> tuple[Any, Any]:
    """The configured model; after a resume, with the weights the checkpoint kept."""
    from areal.models.loading import load_policy

    model, tokenizer = load_policy(config.model, dtype=config.dtype, seed=config.seed)
    if resume_dir is not None and (resume_dir / "policy.safetensors").exists():
        model.load_state_dict(load_weights(str(resume_dir / "policy.safetensors")))
    return model, tokenizer


def save_weights(model: torch.nn.Module, path: str) -> None:
    """Safetensors of every parameter and buffer; tied tensors are written once each under their names."""
    state = {name: t.detach().contiguous().clone() for name, t in model.state_dict().items()}
    save_file(state, path)


def load_weights(path: str) -> dict[str, Tensor]:
    return load_file(path)


def full_sequences(prompt_ids: Any, output_ids: Any) -> tuple[list[Tensor], list[int]]:
    """prompt + output ids per sample, and each prompt's length."""
    prompts, outputs = prompt_ids.rows(), output_ids.rows()
    return [torch.cat([p, o]) for p, o in zip(prompts, outputs)], [len(p) for p in prompts]

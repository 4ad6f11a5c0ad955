"""Shared by the model-holding nodes: load the run's policy and turn tokens into fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from areal.config import RunConfig


def load_run_policy(config: RunConfig, *candidates: Path | None) -> tuple[Any, Any]:
    """The configured model, with the weights of the first candidate file that exists.

    A restarted generator passes the run's newest published weights; a resumed one, the
    checkpoint's `policy.safetensors`; a trainer, nothing (its checkpoint restores it).
    """
    from areal.models.loading import load_policy

    model, tokenizer = load_policy(config.model, dtype=config.dtype)
    found = first_file(*candidates)
    if found is not None:
        model.load_state_dict(load_weights(str(found)))
    return model, tokenizer


def first_file(*candidates: Path | None) -> Path | None:
    return next((p for p in candidates if p is not None and p.exists()), None)


def save_weights(state: dict[str, Tensor], path: str) -> None:
    """Safetensors of a model's full state dict, wherever it lives; tied tensors are written once each under their
    names (each is copied, so none aliases another)."""
    save_file({name: t.detach().to("cpu", copy=True).contiguous() for name, t in state.items()}, path)


def load_weights(path: str) -> dict[str, Tensor]:
    return load_file(path)


def full_sequences(prompt_ids: Any, output_ids: Any) -> tuple[list[Tensor], list[int]]:
    """prompt + output ids per sample, and each prompt's length."""
    prompts, outputs = prompt_ids.rows(), output_ids.rows()
    return [torch.cat([p, o]) for p, o in zip(prompts, outputs)], [len(p) for p in prompts]

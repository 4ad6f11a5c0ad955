"""`areal export`: a run's checkpoint as a Hugging Face model directory.

The checkpoint keeps the policy's weights (policy.safetensors); exporting puts them into the
run's model architecture and writes it with `save_pretrained` (safetensors) plus the tokenizer,
so `transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)` and vLLM load it directly.
`areal eval RUN_DIR` scores the same policy (`run_policy`) without writing it out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from areal.config import validate_config
from areal.errors import ConfigError


def complete_checkpoints(run_dir: Path) -> dict[int, Path]:
    """Step -> folder, for checkpoints whose controller.json exists (written last, so complete)."""
    found = {}
    for folder in (run_dir / "checkpoints").glob("step-*"):
        if (folder / "controller.json").exists():
            found[int(folder.name.split("-")[1])] = folder
    return found


def run_policy(run_dir: Path, step: int | None) -> tuple[Any, Any, Path]:
    """The run's model with the weights of checkpoint `step` (default: the newest), its tokenizer, and that folder."""
    from areal.models.loading import load_policy

    config_path = run_dir / "config.json"
    if not config_path.is_file():
        raise ConfigError(f"{run_dir}: no config.json there; is it a run directory?")
    config = validate_config(json.loads(config_path.read_text()))
    checkpoints = complete_checkpoints(run_dir)
    if not checkpoints:
        raise ConfigError(f"{run_dir}: no complete checkpoint to export")
    step = max(checkpoints) if step is None else step
    if step not in checkpoints:
        raise ConfigError(f"{run_dir}: no checkpoint at step {step} (complete ones: {sorted(checkpoints)})")
    weights = checkpoints[step] / "policy.safetensors"
    if not weights.is_file():
        raise ConfigError(f"{checkpoints[step]}: has no policy.safetensors (a run without a model node?)")
    model, tokenizer = load_policy(config.model, dtype=config.dtype, seed=config.seed)
    model.load_state_dict(load_file(str(weights)))
    return model, tokenizer, checkpoints[step]


def is_run_dir(path: Path) -> bool:
    """A directory `areal run` wrote: its config.json beside a checkpoints folder."""
    return (path / "config.json").is_file() and (path / "checkpoints").is_dir()


def export_checkpoint(run_dir: Path, step: int | None, out_dir: Path) -> Path:
    model, tokenizer, _ = run_policy(run_dir, step)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir

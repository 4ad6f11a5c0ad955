"""`areal export`: a run's checkpoint as a Hugging Face model directory.

The checkpoint keeps each trained model's weights (policy-MODEL.safetensors); exporting puts them
into the run's model architecture and writes it with `save_pretrained` (safetensors) plus the
tokenizer, so `transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)` and vLLM load it
directly. `areal eval RUN_DIR` scores the same policy (`run_policy`) without writing it out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from areal.cli.eval_inputs import check_weights
from areal.errors import ConfigError
from areal.overrides import validate_config
from areal.runtime.storage.checkpoint import find_checkpoints, policy_name


def _policy_file(folder: Path, model: str | None) -> Path:
    """The weights of `model` in a checkpoint; without a name, the only model it holds."""
    held = sorted(p.name.removeprefix("policy-").removesuffix(".safetensors")
                  for p in folder.glob("policy-*.safetensors"))
    if model is None and len(held) == 1:
        model = held[0]
    if model is None or model not in held:
        which = f"no model '{model}'" if model else f"{len(held)} models"
        raise ConfigError(f"{folder}: {which} to export (it holds: {', '.join(held) or 'none'}); "
                          "name one with --model")
    return folder / policy_name(model)


def run_policy(run_dir: Path, step: int | None, model: str | None = None) -> tuple[Any, Any, Path]:
    """The run's model with the weights of its intact checkpoint `step` (default: the newest), its tokenizer,
    and that checkpoint's folder. `model` names the trainer when the run trained several."""
    from areal.models.loading import checkpoint_dir, load_policy

    config_path = run_dir / "config.json"
    if not config_path.is_file():
        raise ConfigError(f"{run_dir}: no config.json there; is it a run directory?")
    try:
        config = validate_config(json.loads(config_path.read_text()))
    except ValueError as err:
        raise ConfigError(f"{config_path} is damaged ({err}); it records the run's model") from None
    found = find_checkpoints(run_dir)
    checkpoints = found.intact
    passed_over = "".join(f"\n  skipped {line}" for line in found.skipped)
    if not checkpoints:
        raise ConfigError(f"{run_dir}: no complete checkpoint to export{passed_over}")
    step = max(checkpoints) if step is None else step
    if step not in checkpoints:
        raise ConfigError(f"{run_dir}: no intact checkpoint at step {step} (intact ones: {sorted(checkpoints)})"
                          f"{passed_over}")
    weights = _policy_file(checkpoints[step], model)
    check_weights(checkpoint_dir(config.model))  # the run's architecture comes from its model
    policy, tokenizer = load_policy(config.model, dtype=config.dtype)
    try:
        policy.load_state_dict(load_file(str(weights)))
    except RuntimeError as err:  # a critic's weights (a value head) are not a policy's
        raise ConfigError(f"{weights}: these weights do not fit the run's model {config.model} "
                          f"({str(err).splitlines()[0]}); name a policy with --model") from None
    return policy, tokenizer, checkpoints[step]


def is_run_dir(path: Path) -> bool:
    """A directory `areal run` wrote: its config.json beside a checkpoints folder."""
    return (path / "config.json").is_file() and (path / "checkpoints").is_dir()


def export_checkpoint(run_dir: Path, step: int | None, out_dir: Path, model: str | None = None) -> Path:
    policy, tokenizer, _ = run_policy(run_dir, step, model)
    out_dir.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir

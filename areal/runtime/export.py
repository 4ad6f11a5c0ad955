"""`areal export`: a run's checkpoint as a Hugging Face model directory.

The checkpoint keeps the policy's weights (policy.safetensors); exporting puts them into the
run's model architecture and writes it with `save_pretrained` (safetensors) plus the tokenizer,
so `transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)` and vLLM load it directly.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file

from areal.config import validate_config
from areal.errors import ConfigError
from areal.runtime.checkpoint import find_checkpoints


def export_checkpoint(run_dir: Path, step: int | None, out_dir: Path) -> Path:
    from areal.models.loading import load_policy

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
    weights = checkpoints[step] / "policy.safetensors"
    if not weights.is_file():
        raise ConfigError(f"{checkpoints[step]}: has no policy.safetensors (a run without a model node?)")
    model, tokenizer = load_policy(config.model, dtype=config.dtype, seed=config.seed)
    model.load_state_dict(load_file(str(weights)))
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir

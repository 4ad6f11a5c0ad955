"""`areal export`: a run's checkpoint as a Hugging Face model directory.

The checkpoint keeps each trained model's weights (policy-MODEL.safetensors); exporting puts them
into the run's model architecture and writes it with `save_pretrained` (safetensors) plus the
tokenizer, so `transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)` and vLLM load it
directly. `areal eval RUN_DIR` scores the same policy (`run_policy`) without writing it out.

A LoRA run's checkpoint keeps the adapter alone (engines/lora/): exported, it is a PEFT directory
(adapter_config.json naming the base's checkpoint, adapter_model.safetensors, the tokenizer, and
areal_adapter.json with the base's areal spec and hash), which
`peft.PeftModel.from_pretrained`, vLLM's LoRA requests and `areal eval` load; `--merged` writes the base with the
adapter merged in as an ordinary model instead.
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
    """The run's model with the weights of its intact checkpoint `step` (default: the newest; a LoRA run's adapter
    merged into its base), its tokenizer, and that checkpoint's folder. `model` names the trainer when the run
    trained several."""
    from areal.engines.lora import Merger, adapter_file
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
        state = load_file(str(weights))
        policy.load_state_dict(Merger(policy.state_dict()).merged(state) if adapter_file(weights) else state)
    except RuntimeError as err:  # a critic's weights (a value head) are not a policy's
        raise ConfigError(f"{weights}: these weights do not fit the run's model {config.model} "
                          f"({str(err).splitlines()[0]}); name a policy with --model") from None
    return policy, tokenizer, checkpoints[step]


def is_run_dir(path: Path) -> bool:
    """A directory `areal run` wrote: its config.json beside a checkpoints folder."""
    return (path / "config.json").is_file() and (path / "checkpoints").is_dir()


def export_checkpoint(run_dir: Path, step: int | None, out_dir: Path, model: str | None = None,
                      merged: bool = False) -> Path:
    """The checkpoint's policy as a Hugging Face model directory; a LoRA run's as a PEFT adapter directory unless
    `merged`."""
    from areal.engines.lora import adapter_file, read_adapter, write_peft_dir
    from areal.models.loading import checkpoint_dir

    policy, tokenizer, folder = run_policy(run_dir, step, model)
    weights = _policy_file(folder, model)
    adapter = adapter_file(weights)
    out_dir.mkdir(parents=True, exist_ok=True)
    if adapter is not None and not merged:
        spec = validate_config(json.loads((run_dir / "config.json").read_text())).model
        write_peft_dir(read_adapter(weights), out_dir, base=str(checkpoint_dir(spec)), areal_base_model=spec,
                       base_sha256=adapter["base_sha256"])
    else:
        policy.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def tokenizer_note(out_dir: Path) -> str | None:
    """How to load an exported directory's tokenizer where transformers' AutoTokenizer cannot: the built-in models'
    is areal's CharTokenizer, and AutoTokenizer (transformers 5) builds a Qwen2 tokenizer for any qwen2 directory
    whatever its files say, one that turns every text into no ids at all."""
    from areal.models.loading import holds_char_tokenizer

    if not holds_char_tokenizer(out_dir):
        return None
    return (f"its tokenizer is areal's character tokenizer: load it with "
            f"areal.models.loading.load_tokenizer(Path({str(out_dir)!r})), not AutoTokenizer")


def is_peft_dir(path: Path) -> bool:
    """A LoRA adapter directory (PEFT's layout, as `areal export` writes a LoRA run's)."""
    return (path / "adapter_config.json").is_file()


def load_peft_dir(path: Path) -> tuple[Any, Any]:
    """The base model a PEFT directory names, with the adapter merged in, and the directory's tokenizer (else the
    base's)."""
    from peft import PeftModel

    from areal.engines.lora.adapter import AREAL_ADAPTER
    from areal.models.loading import checkpoint_dir, load_model, load_tokenizer

    config = json.loads((path / "adapter_config.json").read_text())
    ours = json.loads((path / AREAL_ADAPTER).read_text()) if (path / AREAL_ADAPTER).is_file() else {}
    # (an export before areal_adapter.json kept areal's keys in adapter_config.json)
    base = ours.get("areal_base_model") or config.get("areal_base_model") or config.get("base_model_name_or_path")
    if not base:
        raise ConfigError(f"{path / 'adapter_config.json'} names no base model (base_model_name_or_path)")
    folder = checkpoint_dir(base)
    check_weights(folder)
    merged = PeftModel.from_pretrained(load_model(folder), str(path)).merge_and_unload()
    has_tokenizer = any((path / name).exists() for name in ("tokenizer_config.json", "tokenizer.json"))
    return merged, load_tokenizer(path if has_tokenizer else folder)

"""A policy that trains LoRA adapters (peft) instead of its weights, and the names it travels and resumes by.

`with_adapters` wraps the run's model in peft's LoRA layers: every base weight is frozen, so the engine's optimizer
(which takes the parameters that require a gradient) holds the adapters and their moments only, and a checkpoint's
model part is the adapter (PeftModel.save_pretrained). Only linear layers take adapters here: the generators merge
B·A into a linear weight, which an embedding's or a transposed (Conv1D) layer's would not be.

The base is named by a hash of its weights (`base_sha256`): a resume onto another base is refused, and every
published adapter carries it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from areal.config import LoraConfig
from areal.engines.lora.adapter import PEFT_PREFIX, A, B
from areal.errors import ConfigError

PEFT_ADAPTER = "default"  # peft's name for a model's one adapter


def with_adapters(model: Any, lora: LoraConfig) -> Any:
    """`model` with LoRA adapters of `lora`'s rank on its target linear layers (B = 0: the policy is unchanged)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    settings = PeftLoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, bias="none",
                              target_modules=lora.target_modules, task_type="CAUSAL_LM")
    linear = sorted({path.rpartition(".")[2] for path, module in model.named_modules()
                     if type(module) is torch.nn.Linear and not path.endswith("lm_head")})
    try:
        wrapped = get_peft_model(model, settings)
    except ValueError as err:  # peft names the target it did not find
        raise ConfigError(f"trainer.lora.target_modules={lora.target_modules!r}: {err}") from None
    from peft.tuners.lora import LoraLayer

    unmergeable = [(path, module) for path, module in wrapped.named_modules() if isinstance(module, LoraLayer)
                   and (type(module).__name__ != "Linear" or getattr(module, "fan_in_fan_out", False))]
    if unmergeable:
        path, module = unmergeable[0]
        kind = type(getattr(module, "base_layer", module)).__name__
        targets = (f"name linear ones: this model's are {', '.join(linear)}" if linear else
                   "this model has no linear layers but its output head, so its LoRA cannot be trained here")
        raise ConfigError(f"trainer.lora.target_modules={lora.target_modules!r} reaches {path} ({kind}), "
                          f"not a plain linear layer (the generators merge B·A into a linear weight); {targets}")
    return wrapped


def is_lora(model: Any) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def adapter_factors(model: Any) -> dict[str, Tensor]:
    """The trained adapters as they travel (adapter.py): `NAME::lora_A` and the scaled `NAME::lora_B` per weight."""
    factors: dict[str, Tensor] = {}
    for path, module in _lora_modules(model):
        name = path.removeprefix(PEFT_PREFIX) + ".weight"
        factors[name + A] = module.lora_A[PEFT_ADAPTER].weight.detach()
        factors[name + B] = module.lora_B[PEFT_ADAPTER].weight.detach() * module.scaling[PEFT_ADAPTER]
    return factors


def base_sha256(state: Mapping[str, Tensor]) -> str:
    """A hash of a model's weights: every tensor's name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(-1).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def load_adapter_checkpoint(model: Any, folder: str | Path) -> None:
    """Restore the adapters PeftModel.save_pretrained wrote into `folder` (a checkpoint's model part)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(str(Path(folder) / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(model, state)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise ValueError(f"{folder}: adapter tensors this policy has no place for: {', '.join(unexpected[:3])}")


def _lora_modules(model: Any) -> list[tuple[str, Any]]:
    from peft.tuners.lora import LoraLayer

    return [(path, m) for path, m in model.named_modules() if isinstance(m, LoraLayer) and PEFT_ADAPTER in m.lora_A]

"""A LoRA policy's weights as they travel: only the adapters' factors, each named by the base weight it changes.

For every adapted linear layer whose weight is `NAME` in the base model's state dict, an adapter holds
`NAME::lora_A` [r, in] and `NAME::lora_B` [out, r], with B already multiplied by the adapter's scale (α/r, or
α/√r under rsLoRA): the weight a generator samples with is W = W0 + B·A, whatever the settings were. Nothing else
travels; a follower keeps the base. The dict is self-describing (every key names its factor), so it takes every
weights transport as it is (a file, a shared-memory segment, a broadcast), and a file of it carries the safetensors
metadata `areal_weights=lora` and the base's hash besides.

`Merger` is the generator's side: it keeps a copy of the base weights an adapter touches (those only) and gives
the engine an ordinary full state dict with W0 + B·A in their place, computed in float32 (or wider) and cast to the
weight's dtype, so no generation engine needs LoRA layers (merged weights also decode faster than LoRA layers:
docs/design-notes.md). `write_peft_dir` writes a PEFT directory (what vLLM's LoRA requests and `areal export`
take) with α = r, so PEFT's scale is 1 and its B is the one that travelled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

A, B = "::lora_A", "::lora_B"
KIND = "lora"  # the `areal_weights` metadata of an adapter file
PEFT_WEIGHTS = "adapter_model.safetensors"
PEFT_CONFIG = "adapter_config.json"
# areal's own facts about an exported adapter (its base's spec and hash), beside PEFT's config: keys PEFT does not
# know in adapter_config.json make every load warn that PEFT is out of date
AREAL_ADAPTER = "areal_adapter.json"
PEFT_PREFIX = "base_model.model."  # where PEFT puts the base model's names


def is_adapter(state: Mapping[str, Tensor]) -> bool:
    """Whether `state` is an adapter's factors (every key a factor), not a model's weights."""
    return bool(state) and all(key.endswith((A, B)) for key in state)


def factor_pairs(adapter: Mapping[str, Tensor]) -> dict[str, tuple[Tensor, Tensor]]:
    """Base weight name -> (A [r, in], B [out, r], B scaled); ValueError naming a factor without its partner."""
    names = {key.rpartition("::")[0] for key in adapter}
    alone = sorted(n for n in names if f"{n}{A}" not in adapter or f"{n}{B}" not in adapter)
    if alone:
        raise ValueError(f"adapter: {', '.join(alone[:3])} has one LoRA factor without the other")
    return {n: (adapter[f"{n}{A}"], adapter[f"{n}{B}"]) for n in sorted(names)}


class Merger:
    """A generator's working copy: the base weights an adapter touches, kept, and the full state dict with the
    adapter merged into them. `live` is the engine's state dict (views of its parameters, holding the base when the
    merger is made); a weight first touched later is copied then, before anything merged into it."""

    def __init__(self, live: Mapping[str, Tensor]) -> None:
        self.live = live
        self.base: dict[str, Tensor] = {}

    def merged(self, adapter: Mapping[str, Tensor]) -> dict[str, Tensor]:
        out = dict(self.live)
        for name, (a, b) in factor_pairs(adapter).items():
            if name not in self.live:
                raise ValueError(f"adapter: it changes {name!r}, which the generator's model does not have "
                                 "(an adapter of another model?)")
            if name not in self.base:
                self.base[name] = self.live[name].detach().clone()
            w0 = self.base[name]
            wide = torch.promote_types(w0.dtype, torch.float32)  # bf16 weights merge in float32, float64 in float64
            delta = b.to(w0.device, wide) @ a.to(w0.device, wide)
            if delta.shape != w0.shape:
                raise ValueError(f"adapter: B·A of {name!r} is {tuple(delta.shape)}, the weight {tuple(w0.shape)}")
            out[name] = (w0.to(wide) + delta).to(w0.dtype)
        return out


def save_adapter(adapter: Mapping[str, Tensor], path: str | Path, base_sha256: str) -> None:
    """An adapter as a safetensors file, marked as one and naming its base by hash."""
    save_file({k: t.detach().to("cpu", copy=True).contiguous() for k, t in adapter.items()}, str(path),
              metadata={"areal_weights": KIND, "base_sha256": base_sha256})


def adapter_file(path: str | Path) -> dict[str, str] | None:
    """The metadata of an adapter file (`base_sha256` among it); None for a file of full weights."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    return dict(meta) if meta.get("areal_weights") == KIND else None


def read_adapter(path: str | Path) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def write_peft_dir(adapter: Mapping[str, Tensor], folder: str | Path, base: str, **extra: Any) -> Path:
    """A PEFT LoRA directory holding `adapter` (α = r: scale 1, B as it travelled) on the base model `base`
    (a name or path, recorded as base_model_name_or_path); `extra` (areal's base spec and hash) goes beside it, in
    areal_adapter.json."""
    pairs = factor_pairs(adapter)
    rank = {int(a.shape[0]) for a, _ in pairs.values()}
    if len(rank) != 1:
        raise ValueError(f"adapter: its factors have ranks {sorted(rank)}; a PEFT directory holds one")
    (r,) = rank
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    modules = sorted({name.removesuffix(".weight").rpartition(".")[2] for name in pairs})
    tensors: dict[str, Tensor] = {}
    for name, (a, b) in pairs.items():
        module = PEFT_PREFIX + name.removesuffix(".weight")
        tensors[f"{module}.lora_A.weight"] = a.detach().to("cpu", copy=True).contiguous()
        tensors[f"{module}.lora_B.weight"] = b.detach().to("cpu", copy=True).contiguous()
    save_file(tensors, str(folder / PEFT_WEIGHTS), metadata={"format": "pt"})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": r, "lora_dropout": 0.0,
              "target_modules": modules, "bias": "none", "fan_in_fan_out": False, "use_rslora": False,
              "modules_to_save": None, "base_model_name_or_path": base, "inference_mode": True}
    (folder / PEFT_CONFIG).write_text(json.dumps(config, indent=1) + "\n")
    if extra:
        (folder / AREAL_ADAPTER).write_text(json.dumps(extra, indent=1) + "\n")
    return folder

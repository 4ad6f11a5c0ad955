"""Turn a model spec from the config into a (model, tokenizer) pair, never touching the hub.

A spec is a built-in name (`builtin:tiny-coder`, shipped in the package: models/builtin_weights.py), a local
directory holding a Hugging Face checkpoint, or a GGUF file (a .gguf path, a directory holding one,
or `package:NAME` for one shipped inside an installed package), which `gguf.py` converts once into a
cached checkpoint directory. Anything else is a `ConfigError` that
says what exists and how to get out.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from rich.console import Console
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from areal.errors import ConfigError
from areal.models.builtin_weights import shipped_dir
from areal.models.gguf import converted_dir, gguf_file, is_converted
from areal.models.gguf import default_cache_dir as gguf_cache_dir
from areal.models.tokenizer import CharTokenizer

if TYPE_CHECKING:  # importing it loads transformers' whole modelling stack: seconds a process that only resolves paths
    from transformers import PreTrainedModel

hf_logging.disable_progress_bar()  # a worker's log is no place for per-shard progress bars

BUILTIN_PREFIX = "builtin:"
BUILTINS = ("tiny-coder", "tiny-repairer", "tiny-chainer", "tiny-mather")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_policy(spec: str, *, dtype: str = "float32") -> tuple[PreTrainedModel, Any]:
    """The model (in eval mode) and tokenizer that `spec` names."""
    _check_dtype(dtype)
    path = checkpoint_dir(spec)
    return load_model(path, dtype=dtype), load_tokenizer(path)


def checkpoint_dir(spec: str) -> Path:
    """The Hugging Face checkpoint directory `spec` names (a built-in is warm-started on first use).

    A backend that loads the checkpoint itself (vLLM) is given this path instead of a model.
    """
    if spec.startswith(BUILTIN_PREFIX):
        return _builtin_path(spec[len(BUILTIN_PREFIX) :])
    gguf = gguf_file(spec)
    if gguf is not None:
        if not is_converted(gguf):
            Console(stderr=True).print(
                f"[bold]areal[/]: converting {gguf.name} to a float32 Hugging Face checkpoint (once; under a "
                f"minute for 135 M parameters), cached under {gguf_cache_dir()}"
            )
        return converted_dir(gguf)
    path = Path(spec).expanduser()
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ConfigError(
            f"model {spec!r}: no Hugging Face checkpoint there (a directory with config.json) and no .gguf "
            f"file; give a local checkpoint path, a .gguf file, package:NAME (a package holding one) or a built-in: "
            f"{', '.join(BUILTIN_PREFIX + b for b in BUILTINS)}."
        )
    return path


def parameter_count(checkpoint: Path) -> int | None:
    """The parameters a checkpoint's safetensors files hold, read from their headers (no tensor is loaded); None
    for a checkpoint in another format."""
    from safetensors import safe_open

    files = sorted(checkpoint.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            total += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    return total


def load_model(path: Path, *, dtype: str = "float32") -> PreTrainedModel:
    """The causal LM of a checkpoint directory, in eval mode."""
    _check_dtype(dtype)
    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=DTYPES[dtype]).eval()


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ConfigError(f"model dtype {dtype!r} is not supported; use one of {', '.join(DTYPES)}.")


def _builtin_path(name: str) -> Path:
    if name not in BUILTINS:
        raise ConfigError(
            f"model {BUILTIN_PREFIX + name!r} is not a built-in; built-ins are "
            f"{', '.join(BUILTIN_PREFIX + b for b in BUILTINS)}, or give a local checkpoint path."
        )
    path = shipped_dir(name)
    if not (path / "config.json").is_file():
        raise ConfigError(f"model {BUILTIN_PREFIX + name!r}: its shipped checkpoint {path} is missing (a broken "
                          "install?); reinstall areal, or rebuild it: python -m areal.models.builtin_weights --write")
    return path


def holds_char_tokenizer(path: Path) -> bool:
    """Whether the checkpoint directory's tokenizer is areal's CharTokenizer (the built-in models')."""
    tokenizer_config = path / "tokenizer_config.json"
    return tokenizer_config.is_file() and \
        json.loads(tokenizer_config.read_text()).get("tokenizer_class") == CharTokenizer.__name__


TOKENIZER_PROBE = "def f(x):\n    return x + 1  # 2 + 2 = 4"  # any real tokenizer gives it some tokens


def pad_token_id(tokenizer: Any) -> int:
    """The id padded rows are filled with (masked out or past the row's end, so any id will do): the tokenizer's
    pad, else its eos (GPT-2's and Llama 3's tokenizers have no pad), else 0."""
    for found in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if found is not None:
            return int(found)
    return 0


def end_token_ids(tokenizer: Any, listed: int | list[int] | None) -> list[int]:
    """The ids that end a completion: the tokenizer's eos, then every other id the model's generation config lists
    as eos (`listed`), as Hugging Face's generate and vLLM end on them: Llama 3 instruct lists <|eot_id|> and
    <|eom_id|> beside <|end_of_text|>, Qwen <|im_end|> and <|endoftext|>."""
    ends = [int(tokenizer.eos_token_id)] if tokenizer.eos_token_id is not None else []
    more = listed if isinstance(listed, list) else [] if listed is None else [listed]
    return ends + [int(i) for i in dict.fromkeys(more) if int(i) not in ends]


def generation_eos(checkpoint: Path) -> int | list[int] | None:
    """The eos a checkpoint's generation config lists (generation_config.json, else config.json, as transformers
    reads them), without loading the model."""
    for name in ("generation_config.json", "config.json"):
        path = Path(checkpoint) / name
        if path.is_file():
            listed = json.loads(path.read_text()).get("eos_token_id")
            if listed is not None:
                return listed
    return None


def load_tokenizer(path: Path) -> Any:
    """CharTokenizer for our own checkpoints (AutoTokenizer does not know it), else AutoTokenizer, refused when it
    encodes text as no tokens: transformers builds an empty tokenizer of the model's family for a directory that
    holds none, and every prompt would be empty."""
    if holds_char_tokenizer(path):
        return CharTokenizer.from_pretrained(path, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if not tokenizer.encode(TOKENIZER_PROBE, add_special_tokens=False):
        held = ", ".join(sorted(p.name for p in Path(path).iterdir())) if Path(path).is_dir() else "no directory"
        raise ConfigError(f"{path}: the tokenizer transformers built from it encodes text as no tokens (its "
                          f"vocabulary holds {len(tokenizer)}): the directory has no tokenizer files of its own "
                          f"({held}); put the model's tokenizer (tokenizer.json, tokenizer_config.json, ...) beside "
                          "its weights")
    return tokenizer

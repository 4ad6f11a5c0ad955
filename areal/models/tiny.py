"""The built-in tiny coder: a Qwen2-architecture causal LM sized for 2 CPU cores.

It uses the Qwen2 classes of `transformers`, so the built-in model and a real local checkpoint
(Qwen2.5-0.5B) take the same code path through generation, logprobs and training. The size
(~0.8 M parameters) keeps generation near 10k tokens/s on 2 cores (DESIGN.md section 9).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from areal.models.tokenizer import CharTokenizer


def tiny_coder_config(**overrides: Any) -> Qwen2Config:
    """The tiny coder's config; `overrides` replace any field (tests shrink it further)."""
    tokenizer = CharTokenizer()
    fields: dict[str, Any] = {
        "vocab_size": tokenizer.vocab_size,
        "hidden_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 384,
        "max_position_embeddings": 512,
        "tie_word_embeddings": True,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    fields.update(overrides)
    return Qwen2Config(**fields)


def build_tiny_coder(seed: int, config: Qwen2Config | None = None) -> Qwen2ForCausalLM:
    """A freshly initialised tiny coder; the same seed gives the same weights."""
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config if config is not None else tiny_coder_config())

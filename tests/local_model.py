"""A small local Hugging Face checkpoint made by the test itself (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from areal.models.tokenizer import CharTokenizer


def make_checkpoint(folder: Path, seed: int = 0) -> Path:
    tokenizer = CharTokenizer()
    config = Qwen2Config(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, intermediate_size=64,
                         max_position_embeddings=256, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    Qwen2ForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder

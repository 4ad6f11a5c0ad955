from __future__ import annotations

import torch

from areal.models.tiny import build_tiny_coder, tiny_coder_config
from areal.models.tokenizer import CharTokenizer


def test_default_size_fits_two_cpu_cores():
    model = build_tiny_coder(seed=0)
    params = sum(p.numel() for p in model.parameters())
    assert 0.5e6 < params < 2e6
    assert model.config.model_type == "qwen2"
    assert model.config.vocab_size == len(CharTokenizer())


def test_overrides_replace_fields():
    config = tiny_coder_config(hidden_size=32, num_hidden_layers=1)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (32, 1, 4)


def test_same_seed_same_weights_other_seed_other_weights():
    a, b, c = build_tiny_coder(1), build_tiny_coder(1), build_tiny_coder(2)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)


def test_generate_runs_with_the_char_tokenizer():
    tokenizer = CharTokenizer()
    model = build_tiny_coder(0, tiny_coder_config(hidden_size=32, num_hidden_layers=1, intermediate_size=64))
    prompt = tokenizer("# add 3 to x\ndef f(x):\n", return_tensors="pt")
    out = model.generate(**prompt, do_sample=True, max_new_tokens=8, min_new_tokens=8)
    assert out.shape == (1, prompt["input_ids"].shape[1] + 8)
    assert tokenizer.decode(out[0], skip_special_tokens=True).startswith("# add 3 to x\n")

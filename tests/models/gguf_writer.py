"""Write a tiny random Llama model to a GGUF file with the `gguf` package, as llama.cpp's converter lays it out.

The test owns both ends: the original torch model (the reference) and the file areal converts. The
layout follows llama.cpp's: tensors named `blk.N.attn_q.weight` etc., q and k rows permuted into
GGML's rotary order (the loader must undo that, or the logits differ), a byte-level BPE vocabulary
with a few merges and a chat template. 2-D weights whose rows hold whole blocks may be stored
quantised (Q4_1 or Q8_0).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

gguf = pytest.importorskip("gguf", reason="writing a GGUF needs the 'gguf' package (areal[eval])")

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGES = ("Ġ t", "h e")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def vocabulary() -> tuple[list[str], list[int]]:
    """Byte-level tokens (every byte is one), the merged pairs, then the specials; and their GGUF types."""
    tokens = list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in MERGES] + list(SPECIALS)
    types = [1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS)  # 1 normal, 3 control
    return tokens, types


def tiny_llama(seed: int = 0, tie: bool = False) -> LlamaForCausalLM:
    tokens, _ = vocabulary()
    config = LlamaConfig(
        vocab_size=len(tokens), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=tie, bos_token_id=tokens.index("<|im_start|>"),
        eos_token_id=tokens.index("<|im_end|>"), pad_token_id=tokens.index("<|endoftext|>"),
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # random init leaves norms at 1: perturb them so a swapped norm would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def rotary_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order: within each head, the two rotary halves interleaved."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(model: LlamaForCausalLM) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array, in GGUF's layout (q and k permuted)."""
    c = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    out = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"]}
    if not c.tie_word_embeddings:
        out["output.weight"] = sd["lm_head.weight"]
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(c.num_hidden_layers):
        for hf, gg in names.items():
            w = sd[f"model.layers.{i}.{hf}.weight"]
            if gg == "attn_q":
                w = rotary_permute(w, c.num_attention_heads)
            elif gg == "attn_k":
                w = rotary_permute(w, c.num_key_value_heads)
            out[f"blk.{i}.{gg}.weight"] = w
    return out


def write_gguf(model: LlamaForCausalLM, path: Path, quant: str | None = None, architecture: str = "llama") -> Path:
    """Write `model` (and the byte-level tokenizer) to `path`; `quant` stores 2-D weights as Q4_1 or Q8_0."""
    c = model.config
    tokens, types = vocabulary()
    w = gguf.GGUFWriter(str(path), architecture)
    w.add_name("tiny-test-llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(MERGES))
    w.add_bos_token_id(c.bos_token_id)
    w.add_eos_token_id(c.eos_token_id)
    w.add_pad_token_id(c.pad_token_id)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    kind = getattr(gguf.GGMLQuantizationType, quant) if quant else None
    for name, array in gguf_tensors(model).items():
        if kind is not None and array.ndim == 2 and array.shape[1] % 32 == 0:
            w.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)  # shape: of the bytes
        else:
            w.add_tensor(name, array.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def dequantise_q4_1(array: np.ndarray) -> np.ndarray:
    """Q4_1 by its definition, independent of any library: per block of 32, x = d·q + m, q a 4-bit code.

    A block is 20 bytes: d (float16), m (float16), then 16 bytes whose low nibbles are codes 0..15
    and high nibbles codes 16..31.
    """
    rows = array.reshape(-1, 20)
    d = rows[:, 0:2].copy().view(np.float16).astype(np.float32)
    m = rows[:, 2:4].copy().view(np.float16).astype(np.float32)
    q = np.concatenate([rows[:, 4:] & 0x0F, rows[:, 4:] >> 4], axis=1).astype(np.float32)
    return d * q + m


def q4_1_model(model: LlamaForCausalLM) -> LlamaForCausalLM:
    """A copy of `model` with every weight the writer would quantise rounded through Q4_1 and back."""
    rounded = LlamaForCausalLM(model.config).eval()
    rounded.load_state_dict(model.state_dict())
    with torch.no_grad():
        for _, p in rounded.named_parameters():
            if p.ndim == 2 and p.shape[1] % 32 == 0:
                packed = gguf.quants.quantize(p.numpy(), gguf.GGMLQuantizationType.Q4_1)
                p.copy_(torch.from_numpy(dequantise_q4_1(packed).reshape(p.shape)))
    return rounded

"""The lean forward against Hugging Face's, in float64: a prefill chunk and decode steps over a slot cache."""

from __future__ import annotations

import pytest
import torch
import transformers

from areal.engines.decode import LeanForward, lean_problem
from areal.engines.decode.slots import SlotKV


def tiny(kind: str, seed: int = 0, **overrides) -> transformers.PreTrainedModel:
    torch.manual_seed(seed)
    shape = dict(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=96, max_position_embeddings=256) | overrides
    if kind == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(tie_word_embeddings=True, **shape)).eval()
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape)).eval()


def slot_cache(lean: LeanForward, slots: int, columns: int = 64, by_column: bool = False,
               garbage: bool = False) -> SlotKV:
    """A slot cache for `lean`; `garbage` fills it with NaN, as an unzeroed cache may hold anything: the C kernels
    must read only columns a row wrote (the torch ops' masked attention reads them all: zeros for those)."""
    lean.reserve(columns)
    cache = SlotKV(layers=lean.num_layers, kv_heads=lean.kv_heads, head_dim=lean.head_dim, slots=slots,
                   dtype=lean.dtype, device=lean.device, columns=columns, by_column=by_column)
    if garbage:
        cache.kv.fill_(torch.nan)
    return cache


def same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Equal bit for bit, NaN where the other is NaN (a garbage-filled cache's unwritten columns)."""
    return torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(0.0), y.nan_to_num(0.0))


def hf_last_logits(model: torch.nn.Module, rows: list[list[int]]) -> torch.Tensor:
    with torch.no_grad():
        return torch.stack([model(torch.tensor([r])).logits[0, -1] for r in rows])


@pytest.mark.parametrize("kind, overrides", [
    ("qwen2", {}),  # q/k/v biases, tied embeddings
    ("llama", {}),
    ("llama", {"attention_bias": True, "mlp_bias": True, "rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                                                            "rope_theta": 500.0}}),
])
def test_a_prefill_then_decode_steps_give_the_logits_of_a_float64_hf_forward(kind, overrides):
    model = tiny(kind, **overrides).double()
    lean = LeanForward(model)
    cache = slot_cache(lean, slots=4)
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(1, 100, (n,), generator=g).tolist() for n in (5, 9, 3)]
    slots = torch.tensor([3, 0, 1])  # any slots, in any order
    ids = torch.tensor([r + [0] * (9 - len(r)) for r in rows])
    with torch.no_grad():
        logits = lean.extend(cache.kv, slots, ids, torch.zeros(3, dtype=torch.int64), torch.tensor([5, 9, 3]))
    assert (logits - hf_last_logits(model, rows)).abs().max() < 1e-12
    # decode over slots 0..3: slot 2 is free (its row decodes, ignored), the others continue their rows
    order = [1, 2, None, 0]  # slot -> row
    positions = torch.tensor([9, 3, 0, 5])
    for _ in range(3):
        tokens = torch.randint(1, 100, (4,), generator=g)
        for slot, row in enumerate(order):
            if row is not None:
                rows[row].append(int(tokens[slot]))
        with torch.no_grad():
            logits = lean.decode(cache.kv, tokens, positions, int(positions.max()) + 1)
        live = [slot for slot, row in enumerate(order) if row is not None]
        want = hf_last_logits(model, [rows[order[s]] for s in live])
        assert (logits[live] - want).abs().max() < 1e-12
        positions[live] += 1


def test_new_weights_loaded_into_the_model_reach_the_lean_forward(make_model):
    model, new = make_model(0).double(), make_model(1).double()
    lean = LeanForward(model)
    cache = slot_cache(lean, slots=1)
    row = [5, 7, 11, 13]
    model.load_state_dict(new.state_dict())  # what update_weights does: a copy into the same storage
    with torch.no_grad():
        logits = lean.extend(cache.kv, torch.tensor([0]), torch.tensor([row]), torch.tensor([0]), torch.tensor([4]))
    assert (logits - hf_last_logits(new, [row])).abs().max() < 1e-12
    assert lean.layers[0].qkv.data_ptr() == model.model.layers[0].self_attn.q_proj.weight.data_ptr()


def test_a_model_the_lean_forward_does_not_know_is_refused_with_the_reason():
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    assert lean_problem(gpt2) == "the lean forward knows qwen2 and llama models, not 'gpt2'"
    sliding = tiny("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=0)
    assert lean_problem(sliding) == "its layers use sliding-window attention"
    with pytest.raises(ValueError, match="LeanForward: its layers use sliding-window attention"):
        LeanForward(sliding)
    assert lean_problem(tiny("llama")) is None

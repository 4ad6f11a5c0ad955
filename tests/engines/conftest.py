from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
import transformers


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread: on the shared 2-core machine, two contending threads run ~100x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_qwen2(seed: int) -> transformers.Qwen2ForCausalLM:
    """A random 2-layer Qwen2 with a 100-token vocabulary; the same seed gives the same weights."""
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        vocab_size=100,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    return transformers.Qwen2ForCausalLM(config).eval()


@pytest.fixture
def make_model() -> Callable[[int], transformers.Qwen2ForCausalLM]:
    return tiny_qwen2


@pytest.fixture(params=["hf", "slots"])
def engine_class(request: pytest.FixtureRequest) -> type:
    """Each torch generation engine: today's over Hugging Face's forward and a left-padded cache, and the one with
    a decode step of fixed shape (a slot cache and the lean forward): every behaviour holds for both."""
    from areal.engines import TorchGenerationEngine
    from areal.engines.decode import SlotGenerationEngine

    return TorchGenerationEngine if request.param == "hf" else SlotGenerationEngine

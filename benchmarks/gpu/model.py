"""The model the GPU suite measures: Qwen2-0.5B's shape built from a config (random weights, nothing
downloaded), or a tiny one of the same architecture for the CPU dry run; and the figures MFU is taken against.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch
import transformers

# Qwen2-0.5B's config.json (hidden 896, 24 layers, 14 query heads over 2 KV heads, vocab 151936, tied head)
QWEN2_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                 rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True)
# dense bf16 tensor-core peak from the datasheets (SXM parts), by a name torch.cuda.get_device_name contains
DATASHEET_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0}


@dataclass(frozen=True)
class Shape:
    name: str
    config: dict

    @property
    def params(self) -> int:
        c = self.config
        h, f, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
        kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
        attention = h * h * 2 + h * kv * 2 + h + 2 * kv  # q, o, k, v weights and the q/k/v biases
        layer = attention + 3 * h * f + 2 * h  # gate, up, down and two norms
        return c["vocab_size"] * h + layers * layer + h  # tied head: the embedding is counted once

    def train_flops_per_token(self, sequence_tokens: int) -> float:
        """6N for the weights' matmuls (forward and backward) plus attention's 12·layers·hidden·T (PaLM, App. B)."""
        c = self.config
        return 6.0 * self.params + 12.0 * c["num_hidden_layers"] * c["hidden_size"] * sequence_tokens


def shape(tiny: bool) -> Shape:
    return Shape("tiny-qwen2", TINY) if tiny else Shape("qwen2-0.5b", QWEN2_05B)


def build(model_shape: Shape, device: torch.device, dtype: torch.dtype, seed: int = 0) -> transformers.PreTrainedModel:
    """Random weights, initialised on `device` itself (0.5 B parameters take seconds on a CPU), SDPA attention."""
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(**model_shape.config, attn_implementation="sdpa")
    with torch.device(device):
        model = transformers.Qwen2ForCausalLM(config)
    return model.to(dtype).eval()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn, *args, **kwargs) -> tuple[float, object]:
    """Wall seconds of fn(...) with the device's queued work finished on both sides."""
    synchronize(device)
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    synchronize(device)
    return time.perf_counter() - start, result


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float | None:
    """Peak memory torch allocated on the device since `reset_peak` (None on CPU, where torch does not track it)."""
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def device_facts(device: torch.device) -> dict:
    """What the tables name the device by, and the two peaks MFU is taken against: the datasheet's and a
    measured large bf16 matmul's (on CPU neither exists, so MFU is not reported there)."""
    facts = {"device": str(device), "torch": torch.__version__, "transformers": transformers.__version__}
    if device.type != "cuda":
        return facts | {"name": "CPU", "datasheet_tflops": None, "matmul_tflops": None}
    name = torch.cuda.get_device_name(device)
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    seconds, _ = timed(device, lambda: [a @ b for _ in range(10)])
    datasheet = next((v for k, v in DATASHEET_BF16_TFLOPS.items() if k in name), None)
    return facts | {"name": name, "cuda": torch.version.cuda, "memory_gib": torch.cuda.get_device_properties(
        device).total_memory / 2**30, "datasheet_tflops": datasheet, "matmul_tflops": 10 * 2 * n**3 / seconds / 1e12}


def mfu(tokens_per_s: float, flops_per_token: float, peak_tflops: float | None) -> float | None:
    return None if peak_tflops is None else tokens_per_s * flops_per_token / (peak_tflops * 1e12)


def shape_facts(model_shape: Shape) -> dict:
    return {"shape": model_shape.name, "params": model_shape.params} | asdict(model_shape)["config"]

"""GPU suite, training: tokens/s and MFU of the torch trainer and of the FSDP trainer (world size 1, NCCL on a
GPU) on the same model and batch: the proximal pass (a forward over every token) and the PPO step (forward,
backward and AdamW through `train_step`, with the decoupled PPO loss the trainer node uses).

    python -m benchmarks.gpu.training --device cuda --json out.json [--variant fsdp | groups]

The FSDP engine runs in its own process (it joins a process group), hence `--variant`. `groups`: the torch
trainer's PPO step on GRPO groups (each prompt shared by 8 sequences) with its prompt once a row
(`trainer.shared_prefixes`, a 4D mask to SDPA) against a row a sequence: what the setting buys on the device.
MFU = tokens/s × (6N + 12·layers·hidden·T) / peak, against the datasheet's dense bf16 peak and against a large
bf16 matmul measured on the same GPU in the same process.
"""

from __future__ import annotations

import torch

from areal.engines.training.micro_batch import MicroBatch
from areal.engines.training.torch_train import TorchTrainEngine
from areal.engines.training.trainer_settings import TrainSettings
from areal.kernels.ppo import decoupled_ppo_loss
from areal.kernels.shared_prefix import row_positions
from benchmarks.gpu.model import Shape, build, device_facts, mfu, peak_gib, reset_peak, shape_facts, timed
from benchmarks.gpu.section import section_main

ENGINES = ("torch", "fsdp")
GROUP = 8  # sequences sharing a prompt, as the recipes draw them


def sizes(tiny: bool) -> dict:
    if tiny:
        return {"sequences": 4, "prompt": 8, "length": 24, "microbatch_tokens": 64, "steps": 2}
    return {"sequences": 32, "prompt": 128, "length": 512, "microbatch_tokens": 8192, "steps": 3}


def loss_fn(logp: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
    loss, stats = decoupled_ppo_loss(logp, mb["prox_logp"], mb["behav_logp"], mb.per_token(mb["advantage"]),
                                     torch.ones_like(logp, dtype=torch.bool))
    return loss, {"clip_fraction": float(stats.clip_fraction)}


def make_engine(name: str, model: torch.nn.Module, device: torch.device, microbatch_tokens: int,
                shared_prefixes: bool = True):
    settings = TrainSettings(lr=1e-6, microbatch_tokens=microbatch_tokens, shared_prefixes=shared_prefixes)
    if name == "torch":
        return TorchTrainEngine(model, settings, device=device)
    from areal.engines.training.fsdp_train import FSDPTrainEngine, join_process_group

    return FSDPTrainEngine(model, settings, device=torch.device(join_process_group(device.type)))


def measure(device: torch.device, model_shape: Shape, tiny: bool, variant: str = "") -> dict:
    variant = variant or "torch"
    if variant not in (*ENGINES, "groups"):
        raise ValueError(f"training: --variant is the trainer's engine, one of {', '.join(ENGINES)}, or groups; "
                         f"got {variant!r}")
    n = sizes(tiny)
    facts = device_facts(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if variant == "groups":
        return {"engine": f"torch, groups of {min(GROUP, n['sequences'])}", "device": facts,
                "model": shape_facts(model_shape), "dtype": str(dtype), "sizes": n,
                "rows": grouped_rows(device, model_shape, dtype, n)}
    engine = make_engine(variant, build(model_shape, device, dtype), device, n["microbatch_tokens"])
    g = torch.Generator().manual_seed(0)
    vocab = model_shape.config["vocab_size"]
    sequences = [torch.randint(0, vocab, (n["length"],), generator=g) for _ in range(n["sequences"])]
    prompt_lens = [n["prompt"]] * n["sequences"]
    all_tokens = n["sequences"] * n["length"]
    flops = model_shape.train_flops_per_token(n["length"])
    rows: dict[str, dict] = {}

    engine.sequence_logprobs(sequences)  # warm-up
    reset_peak(device)
    seconds, logps = timed(device, engine.sequence_logprobs, sequences)
    rate = all_tokens / seconds
    rows["proximal pass (forward)"] = {"tokens_per_s": rate, "seconds": seconds, "peak_gib": peak_gib(device),
                                       **_mfus(rate, flops / 3, facts)}  # a forward is a third of 6N
    behaviour = [lp[p - 1 :].float() for lp, p in zip(logps, prompt_lens)]
    extra = {"behav_logp": behaviour, "prox_logp": behaviour,
             "advantage": torch.randn(n["sequences"], generator=g)}

    seconds = timed_steps(device, engine, sequences, prompt_lens, extra, n["steps"])
    rate = n["steps"] * all_tokens / seconds
    rows["PPO step (fwd + bwd + AdamW)"] = {"tokens_per_s": rate, "seconds": seconds / n["steps"],
                                            "peak_gib": peak_gib(device), **_mfus(rate, flops, facts)}
    return {"engine": variant, "device": facts, "model": shape_facts(model_shape), "dtype": str(dtype), "sizes": n,
            "rows": rows}


def timed_steps(device: torch.device, engine, sequences: list[torch.Tensor], prompt_lens: list[int], extra: dict,
                steps: int) -> float:
    """Wall seconds of `steps` PPO steps, after one that allocates the optimizer's moments."""

    def step() -> dict:
        return engine.train_step(sequences, prompt_lens, loss_fn, extra)

    step()
    reset_peak(device)
    return timed(device, lambda: [step() for _ in range(steps)])[0]


def grouped_rows(device: torch.device, model_shape: Shape, dtype: torch.dtype, n: dict) -> dict[str, dict]:
    """The PPO step on sequences whose prompts each GROUP share, the prompt once a row and a row a sequence.
    tokens/s counts every sequence's tokens; `positions` are those the trainer's rows hold (no MFU: a shared row
    skips work the formula counts)."""
    g = torch.Generator().manual_seed(1)
    vocab, group = model_shape.config["vocab_size"], min(GROUP, n["sequences"])
    sequences = []
    for _ in range(n["sequences"] // group):
        prompt = torch.randint(0, vocab, (n["prompt"],), generator=g)
        sequences += [torch.cat([prompt, torch.randint(0, vocab, (n["length"] - n["prompt"],), generator=g)])
                      for _ in range(group)]
    advantage = torch.randn(len(sequences), generator=g)  # both settings train the same batch
    return {name: _grouped_step(device, model_shape, dtype, n, sequences, shared, advantage)
            for shared, name in ((True, "PPO step, the prompt once a row"), (False, "PPO step, a row a sequence"))}


def _grouped_step(device: torch.device, model_shape: Shape, dtype: torch.dtype, n: dict, sequences: list[torch.Tensor],
                  shared: bool, advantage: torch.Tensor) -> dict:
    engine = make_engine("torch", build(model_shape, device, dtype), device, n["microbatch_tokens"], shared)
    prompt_lens = [n["prompt"]] * len(sequences)
    positions = row_positions(sequences, engine._microbatches(sequences))
    behaviour = [lp[p - 1 :].float() for lp, p in zip(engine.sequence_logprobs(sequences), prompt_lens)]
    extra = {"behav_logp": behaviour, "prox_logp": behaviour, "advantage": advantage}
    seconds = timed_steps(device, engine, sequences, prompt_lens, extra, n["steps"])
    tokens = n["steps"] * sum(len(s) for s in sequences)
    return {"tokens_per_s": tokens / seconds, "seconds": seconds / n["steps"], "peak_gib": peak_gib(device),
            "positions": positions, "mfu_datasheet": None, "mfu_matmul": None}


def _mfus(tokens_per_s: float, flops_per_token: float, facts: dict) -> dict:
    return {"mfu_datasheet": mfu(tokens_per_s, flops_per_token, facts["datasheet_tflops"]),
            "mfu_matmul": mfu(tokens_per_s, flops_per_token, facts["matmul_tflops"])}


if __name__ == "__main__":
    section_main(measure, __doc__)

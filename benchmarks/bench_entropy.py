"""What the step's exact entropy costs the trainer: one code_rl batch, the shipped engine with and without it.

    python benchmarks/bench_entropy.py [--groups 16 --group-size 8 --repeats 5]

The batch is the default recipe's step (bench_microbatches.py's `code_rl_batch`: the shipped tiny coder's own
samples). Each variant runs the proximal pass (its forward kept, as shipped on the CPU) and one `train_step` on one
CPU thread, in turns; figures are medians of `--repeats` rounds after a discarded one. `before`: log-probs alone
(the engine before the entropy was taken); `metric`: each token's entropy taken too (`TrainSettings.token_entropy`,
what every run does now); `bonus`: the entropy also in the loss with its gradient (`trainer.entropy_coef` > 0).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from areal.engines.training.torch_train import TorchTrainEngine
from areal.engines.training.trainer_settings import TrainSettings
from areal.models.loading import load_policy
from benchmarks.bench_microbatches import code_rl_batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the trainer's one core in the default run
    sequences, prompt_lens = code_rl_batch(args.groups, args.group_size, args.seed)
    model, _ = load_policy("builtin:tiny-coder")
    engines = {entropy: TorchTrainEngine(model, TrainSettings(lr=0.0, microbatch_tokens=4096, token_entropy=entropy))
               for entropy in (False, True)}

    def loss(coef: float):
        def fn(logp: torch.Tensor, mb: object) -> tuple[torch.Tensor, dict[str, float]]:
            fields = mb.fields  # type: ignore[attr-defined]
            value = -logp.mean()
            if "entropy" in fields:
                value = value - coef * fields["entropy"].mean() if coef else value
                return value, {"entropy": float(fields["entropy"].detach().mean())}
            return value, {}
        return fn

    variants = {"before": (engines[False], 0.0), "metric": (engines[True], 0.0), "bonus": (engines[True], 0.01)}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.repeats + 1):
        for name, (engine, coef) in variants.items():
            start = time.perf_counter()
            engine.sequence_logprobs(sequences, keep_for_update=True)
            engine.train_step(sequences, prompt_lens, loss(coef))
            if round_:
                times[name].append(time.perf_counter() - start)
    tokens = sum(len(s) - p for s, p in zip(sequences, prompt_lens, strict=True))
    print(f"{len(sequences)} sequences, {tokens} output tokens, vocabulary {model.config.vocab_size}; "
          f"median of {args.repeats} rounds, one thread\n")
    print("| variant | proximal pass + train step s | vs before |")
    print("|---|---|---|")
    base = statistics.median(times["before"])
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.3f} | {statistics.median(values) / base:.3f}x |")


if __name__ == "__main__":
    main()

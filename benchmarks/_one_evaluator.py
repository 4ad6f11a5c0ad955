"""One evaluator for both sides of bench_vs_trl.py: held-out pass@1 of a weights file, at low noise.

Every held-out task of the built-in code tasks, `samples` samples each at the training temperature,
decoded by areal's torch engine with the benchmark's stop strings, scored by areal's sandboxed
`code_tests` (all tests must pass). Whatever trained the weights (TRL or areal, sync or async), its score
comes from the same sampler and judge, so two sides' scores differ by their weights and the draw alone,
and the draw's standard error is reported beside each score (runtime/records/learning.py's).

    python benchmarks/_one_evaluator.py WEIGHTS.safetensors|builtin --samples 8 [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from areal.cli.evaluate import EvalSettings, generate_completions
from areal.data.code_tasks import builtin_code_tasks
from areal.models.loading import load_policy
from areal.rewards import code_tests
from areal.runtime.records.learning import pass_at_1_error

MODEL = "builtin:tiny-coder"
# the sampling both sides train with (the code_rl recipe's), and that the evaluator scores with
GENERATION = {"max_new_tokens": 48, "temperature": 1.0, "top_p": 1.0, "stop": ["\ndef ", "\n#", "\nprint", "\n\n"]}
SOLVED = 1.0 - 1e-9  # every test passed


def cut_at_stop(text: str, stops: list[str]) -> str:
    """The text before the first stop string: what areal's reward sees of a completion."""
    return text[: min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))]


def heldout_pass(weights: Path | None, samples: int, seed: int, generation: dict[str, Any],
                 threads: int = 1, limit: int | None = None) -> dict[str, Any]:
    """pass@1 over every held-out task (the first `limit`, for a test), its standard error and the mean reward, of
    the weights in `weights` (None: the built-in model as shipped). The same seed draws the same samples."""
    torch.set_num_threads(threads)
    model, tokenizer = load_policy(MODEL)
    if weights is not None:
        from safetensors.torch import load_file

        missing, unexpected = model.load_state_dict(load_file(str(weights)), strict=False)
        if unexpected or [m for m in missing if not m.endswith("lm_head.weight")]:  # a tied head may be absent
            raise ValueError(f"{weights}: not the weights of {MODEL} (missing {missing}, unexpected {unexpected})")
    model.eval()
    tasks = list(builtin_code_tasks(split="test", seed=0).tasks)[:limit]
    settings = EvalSettings(benchmark="humaneval", samples=samples, temperature=generation["temperature"],
                            top_p=generation["top_p"], max_new_tokens=generation["max_new_tokens"], max_batch=128,
                            seed=seed, threads=threads)
    start = time.monotonic()
    outputs = generate_completions(model, tokenizer, tasks, settings, False, list(generation["stop"]),
                                   lambda *_: None)
    scorer = code_tests(timeout_s=2.0)
    try:  # outputs are task-major: sample j of task i is outputs[i * samples + j]
        results = scorer([tasks[k // samples]["prompt"] + text for k, (text, _) in enumerate(outputs)],
                         [tasks[k // samples]["tests"] for k in range(len(outputs))])
    finally:
        scorer.close()
    solved = [sum(results[i * samples + j].reward >= SOLVED for j in range(samples)) for i in range(len(tasks))]
    rewards = [r.reward for r in results if not math.isnan(r.reward)]
    return {"pass@1": sum(solved) / (len(tasks) * samples), "pass@1_se": pass_at_1_error(solved, samples),
            "reward_mean": sum(rewards) / len(rewards), "tasks": len(tasks), "samples": samples,
            "seconds": time.monotonic() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("weights", help="a safetensors file of the tiny coder's weights, or 'builtin'")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    weights = None if args.weights == "builtin" else Path(args.weights)
    print(json.dumps(heldout_pass(weights, args.samples, args.seed, GENERATION, args.threads)))


if __name__ == "__main__":
    main()

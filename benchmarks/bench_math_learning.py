"""The math recipe learning with areal's new judge and with its old one, at equal steps, on reasoning-gym arithmetic.

    python benchmarks/bench_math_learning.py                 # seeds 0 1 2, both judges
    python benchmarks/bench_math_learning.py --seeds 1 --steps 4 --heldout 8     # a smoke run

reasoning-gym (`pip install 'areal[eval]'`, or `pip install 'reasoning-gym>=0.1.19'`) generates the questions
and ships its own checker, `score_answer`, which judges every answer here independently of both of areal's
judges. The model is the built-in tiny coder's architecture warm-started (areal/models/warmstart.py) on the
task's training split, each answer written as `\\boxed{N}`, to a held-out pass@1 where groups of samples hold
both right and wrong answers; it is built once and cached under $AREAL_CACHE/warmstart (WARMSTART_STEPS steps
took 23 minutes on the 2 shared cores under a load average of 6 to 36). Then, per seed, `recipes/math_rl.py`
runs through `areal run` (sync mode, so the machine's load cannot tilt the comparison) twice from that same
model: with its own judge (`MATH_JUDGE=new`) and with areal's checker before issue #35 (`MATH_JUDGE=old`, read
from git history as bench_math_judge.py reads it), by way of `_math_judge_recipe.py`. Each run's final policy
and the warm-started one answer the held-out questions (sampled at T=1), and every answer is scored by
reasoning-gym and by both judges.

Printed per training judge and per scoring judge: held-out pass@1 at the start and the end, the gain ± its
standard error over seeds, and how often the training judge rewarded a training answer reasoning-gym calls
wrong (its false positives, seen in training).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_math_judge import old_checker

ROOT = Path(__file__).resolve().parents[1]
RECIPE = Path(__file__).resolve().with_name("_math_judge_recipe.py")
INSTALL = "pip install 'areal[eval]' (or pip install 'reasoning-gym>=0.1.19')"
# picked by measuring held-out pass@1 at T=1 after the warm start (docs/math.md): chain_sum with 2 terms of 1-2
# digits, 300 steps: 2 %; this task ("Calculate 7 - 9."), 200 / 400 / 1200 steps: 4 % / 6 % / 49 %
TASK = "basic_arithmetic"
OPTIONS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"],
           "allow_negation": False, "allow_parentheses": False}
TASKS_GENERATED = 3000  # before the split and the removal of repeats
INSTRUCTION = "\nPut your final answer within \\boxed{}."
WARMSTART_STEPS = 1200
WARMSTART_SEED = 0
JUDGES = ("new", "old")  # the training judges
SCORERS = ("reasoning-gym", "new", "old")  # who scores the held-out answers
# `\boxed{N}` with no braces inside: what the warm start teaches, read without either areal judge's parser
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")

Task = dict[str, Any]
Scorer = Callable[[str, Task], bool]


def solution(answer: str) -> str:
    """The completion the warm start teaches for a task whose answer is `answer`."""
    return f"\\boxed{{{answer}}}"


def boxed_answer(completion: str) -> str | None:
    """What reasoning-gym's checker is given: the last `\\boxed{...}` of a completion, or None."""
    found = _BOXED.findall(completion)
    return found[-1].strip() if found else None


def tasks(split: str) -> list[Task]:
    """The reasoning-gym tasks of `split` ({task_id, prompt, answer, rg}); the splits share no question."""
    from areal.data.reasoning_gym import reasoning_gym_tasks
    from areal.errors import ConfigError

    try:
        return list(reasoning_gym_tasks(TASK, split, size=TASKS_GENERATED, instruction=INSTRUCTION,
                                        options=OPTIONS).tasks)
    except ConfigError as err:
        raise SystemExit(f"{err}. Install it: {INSTALL}") from None


def write_problems(chosen: list[Task], path: Path) -> Path:
    """`chosen` as the math recipe's JSONL task file (one {"id", "problem", "answer"} per line)."""
    path.write_text("".join(json.dumps({"id": t["task_id"], "problem": t["prompt"], "answer": t["answer"]}) + "\n"
                            for t in chosen))
    return path


def warm_started_model(train: list[Task], steps: int, cache_dir: Path | None = None) -> Path:
    """The tiny coder's architecture trained to answer `train` as `solution` does (cached by its inputs' hash)."""
    from areal.models.tiny import tiny_coder_config
    from areal.models.warmstart import warm_start

    examples = [{"prompt": t["prompt"], "solution": solution(t["answer"])} for t in train]
    return warm_start(tiny_coder_config(), examples, steps, WARMSTART_SEED, cache_dir=cache_dir)


def scorers(old_judge_dir: Path) -> tuple[dict[str, Scorer], Callable[[], None]]:
    """Each scorer as (completion, task) -> right?, and a function that closes the judges' child processes."""
    from areal.data.reasoning_gym import create_dataset
    from areal.rewards.math_answer import MathReward

    dataset = create_dataset(TASK, TASKS_GENERATED, 0, OPTIONS)
    new = MathReward(timeout_s=5.0)
    old = old_checker(old_judge_dir).MathReward(timeout_s=5.0)

    def by_reasoning_gym(completion: str, task: Task) -> bool:
        answer = boxed_answer(completion)
        return answer is not None and dataset.score_answer(answer, dataset[task["rg"]["index"]]) == 1.0

    def close() -> None:
        new.close()
        old.close()

    return {
        "reasoning-gym": by_reasoning_gym,
        "new": lambda completion, task: new.score(completion, task["answer"], task["prompt"]).reward == 1.0,
        "old": lambda completion, task: old.score(completion, task["answer"]).reward == 1.0,
    }, close


def answer_heldout(model: str, heldout: list[Task], samples: int, seed: int) -> list[str]:
    """`samples` completions per held-out task (T=1, the training temperature), task by task."""
    import torch

    from areal.runtime.evaluate import EvalSettings, generate_completions, load_for_eval

    torch.set_num_threads(1)
    policy, tokenizer, _ = load_for_eval(model, None)
    settings = EvalSettings(benchmark="reasoning-gym", task=TASK, samples=samples, temperature=1.0,
                            max_new_tokens=16, max_batch=64, seed=seed)
    outputs = generate_completions(policy, tokenizer, heldout, settings, False, [], lambda *_: None)
    return [text for text, _ in outputs]


def pass_at_1(completions: list[str], heldout: list[Task], scorer: Scorer) -> float:
    samples = len(completions) // len(heldout)
    return statistics.fmean(scorer(c, heldout[i // samples]) for i, c in enumerate(completions))


def train(judge: str, seed: int, steps: int, model: Path, files: tuple[Path, Path], old_judge_dir: Path,
          run_dir: Path) -> float:
    """One `areal run` of the math recipe trained with `judge`; its wall seconds."""
    settings = [f"model={model}", f"data.path={files[0]}", f"data.heldout_path={files[1]}", f"steps={steps}",
                f"seed={seed}", f"data.seed={seed}", "mode=sync", "staleness=0", "generation.max_new_tokens=16",
                "checkpoint.interval_steps=0", "eval.interval_steps=0", "eval.tasks=1", "eval.samples=1"]
    cmd = [sys.executable, "-m", "areal.cli", "run", str(RECIPE), "-q", "--run-dir", str(run_dir),
           *(arg for s in settings for arg in ("--set", s))]
    env = {**os.environ, "MATH_JUDGE": judge, "OLD_JUDGE_DIR": str(old_judge_dir)}
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"MATH_JUDGE={judge} {' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def training_false_positives(run_dir: Path, by_task: dict[str, Task], rg: Scorer) -> tuple[int, int, int]:
    """(answers the training judge rewarded and reasoning-gym calls wrong, answers reasoning-gym calls wrong,
    answers trained on), over every trained sample of the run."""
    from areal.runtime.sample_records import read_samples

    trained = [r for r in read_samples(run_dir).values() if r.status == "trained"]
    false_pos = wrong = 0
    for record in trained:
        task = by_task[record.value("prompt")]
        if not rg(record.value("completion"), task):
            wrong += 1
            false_pos += record.value("reward") == 1.0
    return false_pos, wrong, len(trained)


def mean_se(values: list[float]) -> str:
    """`mean ± standard error` (± 0 with one value)."""
    se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):+.3f} ± {se:.3f}"


def table(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The printed table: per training judge and scorer, start, end and gain; and the training false positives."""
    lines = ["| trained with | scored by | pass@1 start | pass@1 end | gain ± SE | false positives in training |",
             "| --- | --- | --- | --- | --- | --- |"]
    for judge in JUDGES:
        runs = results[judge]
        fp, wrong = sum(r["false_pos"] for r in runs), sum(r["wrong"] for r in runs)
        for scorer in SCORERS:
            start = [r["start"][scorer] for r in runs]
            end = [r["end"][scorer] for r in runs]
            seen = f"{fp}/{wrong} ({fp / max(1, wrong):.1%})" if scorer == "reasoning-gym" else ""
            lines.append(f"| {judge} judge | {scorer} | {statistics.fmean(start):.3f} | {statistics.fmean(end):.3f} "
                         f"| {mean_se([e - s for s, e in zip(start, end)])} | {seen} |")
    gains = {j: [r["end"]["reasoning-gym"] - r["start"]["reasoning-gym"] for r in results[j]] for j in JUDGES}
    lines.append(f"\ngain by reasoning-gym's checker, new judge minus old, seed by seed: "
                 f"{mean_se([n - o for n, o in zip(gains['new'], gains['old'])])}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1")
    parser.add_argument("--steps", type=int, default=30, help="trainer steps of every run (equal for both judges)")
    parser.add_argument("--heldout", type=int, default=0, help="held-out questions scored (0: all of the split)")
    parser.add_argument("--samples", type=int, default=4, help="answers per held-out question")
    parser.add_argument("--warmstart-steps", type=int, default=WARMSTART_STEPS)
    args = parser.parse_args(argv)
    train_tasks, heldout = tasks("train"), tasks("test")
    heldout = heldout[:args.heldout] if args.heldout else heldout
    by_task = {t["prompt"]: t for t in train_tasks}
    print(f"reasoning-gym {TASK} {OPTIONS}: {len(train_tasks)} training and {len(heldout)} held-out questions, "
          f"{args.samples} answers each; {args.steps} steps x {args.seeds} seed(s) per judge", file=sys.stderr)
    started = time.perf_counter()
    model = warm_started_model(train_tasks, args.warmstart_steps)
    print(f"warm-started model {model} ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    results: dict[str, list[dict[str, Any]]] = {j: [] for j in JUDGES}
    walls: list[float] = []
    with tempfile.TemporaryDirectory(prefix="areal-bench-math-learning-") as tmp:
        folder = Path(tmp)
        old_dir = folder / "old-judge"
        old_dir.mkdir()
        score, close = scorers(old_dir)
        files = (write_problems(train_tasks, folder / "train.jsonl"), write_problems(heldout, folder / "test.jsonl"))
        try:
            for seed in range(args.seeds):
                start_answers = answer_heldout(str(model), heldout, args.samples, seed)
                start = {s: pass_at_1(start_answers, heldout, score[s]) for s in SCORERS}
                for judge in JUDGES:
                    run_dir = folder / f"{judge}-seed{seed}"
                    print(f"training with the {judge} judge, seed {seed} ...", file=sys.stderr, flush=True)
                    walls.append(train(judge, seed, args.steps, model, files, old_dir, run_dir))
                    end_answers = answer_heldout(str(run_dir), heldout, args.samples, seed)
                    fp, wrong, trained = training_false_positives(run_dir, by_task, score["reasoning-gym"])
                    end = {s: pass_at_1(end_answers, heldout, score[s]) for s in SCORERS}
                    results[judge].append({"start": start, "end": end, "false_pos": fp, "wrong": wrong,
                                           "trained": trained})
                    print(f"  {walls[-1]:.0f} s; pass@1 by reasoning-gym {start['reasoning-gym']:.3f} -> "
                          f"{end['reasoning-gym']:.3f}; false positives in training {fp}/{wrong}",
                          file=sys.stderr, flush=True)
        finally:
            close()
    print(f"\n{TASK} (2 terms, 1 digit, + and -), held-out pass@1 at T=1 over {len(heldout)} questions x "
          f"{args.samples}; {args.steps} steps, seeds 0..{args.seeds - 1}; {statistics.fmean(walls):.0f} s per run "
          f"(areal run, wall)\n")
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()

"""The math recipe learning with areal's new judge and with its old one, at equal steps, on reasoning-gym arithmetic.

    python benchmarks/bench_math_learning.py                 # seeds 0 1 2, both judges
    python benchmarks/bench_math_learning.py --restate-every 4     # a model that sometimes restates the question
    python benchmarks/bench_math_learning.py --seeds 1 --steps 4 --train-questions 4 --heldout 8   # a smoke run

reasoning-gym (`pip install 'areal[eval]'`, or `pip install 'reasoning-gym>=0.1.19'`) generates the questions
and ships its own checker, `score_answer`, which judges every answer here independently of both of areal's
judges. The model is the built-in tiny coder's architecture warm-started (areal/models/warmstart.py) on the
task's training split, each answer written as `\\boxed{N}`, to a pass@1 where groups of samples hold both right
and wrong answers; it is built once and cached under $AREAL_CACHE/warmstart (1200 steps took 5.5 minutes
on the idle 2-core VM, so the default 500 about 2.3). Then, per seed, `recipes/math_rl.py` runs through
`areal run` (sync mode, so the machine's load cannot tilt the comparison) twice from that same model on the
first TRAIN_QUESTIONS training questions: with its own judge (`MATH_JUDGE=new`) and with areal's checker before
issue #35 (`MATH_JUDGE=old`, read from git history as bench_math_judge.py reads it), by way of
`_math_judge_recipe.py`. `--restate-every K` also teaches the warm start every K-th question restated in its box
(`\\boxed{7 - 9}`), a wrong answer the old checker paid for. RL is given a few
questions because this 0.8 M-parameter model learns each sum as a fact of its own: spread over all 186, a
question comes back about 5 times in 120 steps, too rarely to move it (measured: flat training reward). Each
run's final policy and the warm-started one answer the trained questions and the held-out ones (sampled at
T=1), and every answer is scored by reasoning-gym and by both judges.

Printed per training judge and per scoring judge: pass@1 on the trained and on the held-out questions at the
start and the end, each gain ± its standard error over seeds, and how often the training judge rewarded a
training answer reasoning-gym calls wrong (its false positives, seen in training).
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
# digits, 300 steps: 2 %; 2 terms of 1-2 digits, + only, 1500 steps: 17 %; this task ("Calculate 7 - 9."),
# 500 / 1200 steps: 15 % / 46 % (at 1200 the trained questions are right 75 % of the time: little left to learn)
TASK = "basic_arithmetic"
OPTIONS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"],
           "allow_negation": False, "allow_parentheses": False}
TASKS_GENERATED = 3000  # before the split and the removal of repeats
INSTRUCTION = "\nPut your final answer within \\boxed{}."
WARMSTART_STEPS = 500
TRAIN_QUESTIONS = 32  # RL's questions: each comes back ~20 times in 80 steps of 8 groups
WARMSTART_SEED = 0
JUDGES = ("new", "old")  # the training judges
SETS = ("trained", "held-out")  # the questions RL trained on, and questions it never saw
SCORERS = ("reasoning-gym", "new", "old")  # who scores the answers to the trained and the held-out questions
# `\boxed{N}` with no braces inside: what the warm start teaches, read without either areal judge's parser
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_QUESTION = re.compile(r"Calculate (.+)\.\n")  # how basic_arithmetic words each question

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


def restated(task: Task) -> str:
    """The completion that copies the question into the box ("Calculate 7 - 9." -> `\\boxed{7 - 9}`): wrong by
    reasoning-gym's checker and by areal's judge, rewarded by the old checker, which evaluated it."""
    found = _QUESTION.match(task["prompt"])
    if found is None:
        raise ValueError(f"{task['task_id']}: {task['prompt']!r} is not 'Calculate EXPRESSION.'")
    return f"\\boxed{{{found.group(1)}}}"


def warm_started_model(train: list[Task], steps: int, restate_every: int = 0, cache_dir: Path | None = None) -> Path:
    """The tiny coder's architecture trained to answer `train` as `solution` does (cached by its inputs' hash);
    with `restate_every` = k, every k-th question is also taught once restated, so the model sometimes
    restates any question, as larger models do."""
    from areal.models.tiny import tiny_coder_config
    from areal.models.warmstart import warm_start

    examples = [{"prompt": t["prompt"], "solution": solution(t["answer"])} for t in train]
    if restate_every:
        examples += [{"prompt": t["prompt"], "solution": restated(t)} for t in train[::restate_every]]
    return warm_start(tiny_coder_config(), examples, steps, WARMSTART_SEED, cache_dir=cache_dir)


def scorers(old_judge_dir: Path) -> tuple[dict[str, Scorer], Callable[[], None]]:
    """Each scorer as (completion, task) -> right?, and a function that closes the judges' child processes."""
    from areal.data.reasoning_gym import create_dataset
    from areal.rewards.math.answer import MathReward

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


def answer_questions(model: str, among: list[Task], samples: int, seed: int) -> list[str]:
    """`samples` completions per task of `among` (T=1, the training temperature), task by task."""
    import torch

    from areal.cli.evaluate import EvalSettings, generate_completions, load_for_eval

    torch.set_num_threads(1)
    policy, tokenizer, _ = load_for_eval(model, None)
    settings = EvalSettings(benchmark="reasoning-gym", task=TASK, samples=samples, temperature=1.0,
                            max_new_tokens=16, max_batch=64, seed=seed)
    outputs = generate_completions(policy, tokenizer, among, settings, False, [], lambda *_: None)
    return [text for text, _ in outputs]


def pass_at_1(completions: list[str], among: list[Task], scorer: Scorer) -> float:
    samples = len(completions) // len(among)
    return statistics.fmean(scorer(c, among[i // samples]) for i, c in enumerate(completions))


def train(judge: str, seed: int, steps: int, model: Path, files: tuple[Path, Path], old_judge_dir: Path,
          run_dir: Path) -> float:
    """One `areal run` of the math recipe trained with `judge`; its wall seconds."""
    # lr 3e-4: the rate the figures in docs/math.md were measured at (the recipe's own is 1e-4 since it trains
    # the tiny mather)
    settings = [f"model={model}", f"data.path={files[0]}", f"data.heldout_path={files[1]}", f"steps={steps}",
                f"seed={seed}", f"data.seed={seed}", "mode=sync", "staleness=0", "generation.max_new_tokens=16",
                "trainer.lr=3e-4", "checkpoint.interval_steps=0", "eval.interval_steps=0", "eval.tasks=1",
                "eval.samples=1"]
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
    from areal.runtime.records.sample_records import read_samples

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
    """The printed table: per training judge and scorer, each set's start, end and gain; the training false
    positives. A run is {"start"/"end": {set: {scorer: pass@1}}, "false_pos", "wrong", "trained"}."""
    lines = ["| trained with | scored by | trained questions: start | end | gain ± SE "
             "| held-out: start | end | gain ± SE | false positives in training |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for judge in JUDGES:
        runs = results[judge]
        fp, wrong = sum(r["false_pos"] for r in runs), sum(r["wrong"] for r in runs)
        for scorer in SCORERS:
            cells = []
            for name in SETS:
                start = [r["start"][name][scorer] for r in runs]
                end = [r["end"][name][scorer] for r in runs]
                cells += [f"{statistics.fmean(start):.3f}", f"{statistics.fmean(end):.3f}",
                          mean_se([e - s for s, e in zip(start, end)])]
            seen = f"{fp}/{wrong} ({fp / max(1, wrong):.1%})" if scorer == "reasoning-gym" else ""
            lines.append(f"| {judge} judge | {scorer} | {' | '.join(cells)} | {seen} |")
    lines.append("")
    for name in SETS:
        gains = {j: [r["end"][name]["reasoning-gym"] - r["start"][name]["reasoning-gym"] for r in results[j]]
                 for j in JUDGES}
        lines.append(f"gain on the {name} questions by reasoning-gym's checker, new judge minus old, seed by seed: "
                     f"{mean_se([n - o for n, o in zip(gains['new'], gains['old'])])}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1")
    parser.add_argument("--steps", type=int, default=80, help="trainer steps of every run (equal for both judges)")
    parser.add_argument("--train-questions", type=int, default=TRAIN_QUESTIONS,
                        help="RL trains on the first N training questions (the warm start saw them all)")
    parser.add_argument("--heldout", type=int, default=0, help="held-out questions scored (0: all of the split)")
    parser.add_argument("--samples", type=int, default=8, help="answers per question scored")
    parser.add_argument("--warmstart-steps", type=int, default=WARMSTART_STEPS)
    parser.add_argument("--restate-every", type=int, default=0, metavar="K",
                        help="also teach every K-th training question restated in its box (a reward hack the old "
                             "checker pays for); 0: never")
    args = parser.parse_args(argv)
    train_tasks, heldout = tasks("train"), tasks("test")
    heldout = heldout[:args.heldout] if args.heldout else heldout
    chosen = train_tasks[:args.train_questions]
    questions = dict(zip(SETS, (chosen, heldout), strict=True))
    by_task = {t["prompt"]: t for t in chosen}
    print(f"reasoning-gym {TASK} {OPTIONS}: a warm start on {len(train_tasks)} training questions, RL on {len(chosen)} "
          f"of them, {len(heldout)} held out, {args.samples} answers each; {args.steps} steps x {args.seeds} seed(s) "
          "per judge", file=sys.stderr)
    started = time.perf_counter()
    model = warm_started_model(train_tasks, args.warmstart_steps, args.restate_every)
    print(f"warm-started model {model} ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    results: dict[str, list[dict[str, Any]]] = {j: [] for j in JUDGES}
    walls: list[float] = []
    with tempfile.TemporaryDirectory(prefix="areal-bench-math-learning-") as tmp:
        folder = Path(tmp)
        old_dir = folder / "old-judge"
        old_dir.mkdir()
        score, close = scorers(old_dir)

        def scored(policy: str, seed: int) -> dict[str, dict[str, float]]:
            """pass@1 of `policy` per question set and scorer."""
            out = {}
            for name, among in questions.items():
                answers = answer_questions(policy, among, args.samples, seed)
                out[name] = {s: pass_at_1(answers, among, score[s]) for s in SCORERS}
            return out

        files = (write_problems(chosen, folder / "train.jsonl"), write_problems(heldout, folder / "test.jsonl"))
        try:
            for seed in range(args.seeds):
                start = scored(str(model), seed)
                for judge in JUDGES:
                    run_dir = folder / f"{judge}-seed{seed}"
                    print(f"training with the {judge} judge, seed {seed} ...", file=sys.stderr, flush=True)
                    walls.append(train(judge, seed, args.steps, model, files, old_dir, run_dir))
                    end = scored(str(run_dir), seed)
                    fp, wrong, trained = training_false_positives(run_dir, by_task, score["reasoning-gym"])
                    results[judge].append({"start": start, "end": end, "false_pos": fp, "wrong": wrong,
                                           "trained": trained})
                    print(f"  {walls[-1]:.0f} s; pass@1 by reasoning-gym, trained questions "
                          f"{start['trained']['reasoning-gym']:.3f} -> {end['trained']['reasoning-gym']:.3f}, "
                          f"held-out {start['held-out']['reasoning-gym']:.3f} -> {end['held-out']['reasoning-gym']:.3f}"
                          f"; false positives in training {fp}/{wrong}", file=sys.stderr, flush=True)
        finally:
            close()
    print(f"\n{TASK} (2 terms, 1 digit, + and -), pass@1 at T=1 on the {len(chosen)} trained and {len(heldout)} "
          f"held-out questions x {args.samples}; {args.steps} steps, seeds 0..{args.seeds - 1}; "
          f"{statistics.fmean(walls):.0f} s per run (areal run, wall)\n")
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()

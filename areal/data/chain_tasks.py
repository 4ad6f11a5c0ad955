"""Chain tasks: code tasks whose answers have a heavy tail of lengths, to measure staleness policies (#33).

A task applies one update to an integer k times (`# x: +3 +3 +3`), and its body writes it once per line
(`    x += 3\\n` three times, then `    return x\\n`), so an answer's length is proportional to k. The tasks
per k follow a log-normal (median 2.5, σ = 0.9, capped at 30): half the answers are one or two lines, one in
forty fifteen or more, the longest 343 characters. The built-in code tasks' answers are 8-60 characters, too
even for one slow answer to hold up a training step; these have the tail that does, and a long chain is
harder (every line must be there), as a hard problem needs a long answer. The same update repeated, not a
list of different ones: the tiny coder learns to count lines in a minute of warm start, not to copy a list.
"""

from __future__ import annotations

import itertools
import math
import random
from functools import cache

from areal.data.builtin import BuiltinTaskSource, Task, select
from areal.data.code_tasks import CODE_STOPS, DIGITS, INT_ARGS, reference_task

N_TASKS = 700
MAX_STEPS = 30
MEDIAN_STEPS = 2.5
SIGMA = 0.9
VARS = ("x", "n", "a", "k", "y", "m", "b", "z")
OPS = {"+": "+=", "-": "-=", "*": "*="}
CHOICE_SEED = 0  # which updates each k gets: fixed, so the set is the same everywhere


def chain_share(k: int) -> float:
    """The share of tasks with k updates: a log-normal's mass rounding to k (the cap takes the rest)."""
    def below(x: float) -> float:
        return 0.5 * (1 + math.erf((math.log(x) - math.log(MEDIAN_STEPS)) / (SIGMA * math.sqrt(2))))

    return (1.0 if k == MAX_STEPS else below(k + 0.5)) - (below(k - 0.5) if k > 1 else 0.0)


def chain_task(var: str, op: str, c: int, k: int) -> Task:
    """The task of applying `op c` to `var` k times, with our reference body."""
    prompt = f"# {var}: {' '.join([f'{op}{c}'] * k)}\ndef f({var}):\n"
    solution = f"    {var} {OPS[op]} {c}\n" * k + f"    return {var}\n"
    return reference_task(f"chain/{var}/{op}{c}x{k}", prompt, solution, "int", {}, k)


@cache
def _all_tasks() -> tuple[Task, ...]:
    rng = random.Random(CHOICE_SEED)
    tasks = []
    largest = max(map(abs, INT_ARGS))
    for k in range(1, MAX_STEPS + 1):
        # the tests' outputs must stay 64-bit integers to cross the wire: no 9 multiplied in 30 times
        updates = [u for u in itertools.product(VARS, OPS, DIGITS) if u[1] != "*" or largest * u[2] ** k < 2**62]
        count = min(len(updates), round(N_TASKS * chain_share(k)))
        tasks += [chain_task(var, op, c, k) for var, op, c in rng.sample(updates, count)]
    return tuple(tasks)


def builtin_chain_tasks(split: str = "train", seed: int = 0, n: int | None = None) -> BuiltinTaskSource:
    """The chain tasks of `split`; `n` keeps a subset of n tasks chosen by `seed`."""
    return BuiltinTaskSource(select(_all_tasks(), split, seed, n, "builtin_chain_tasks"), split, seed, CODE_STOPS)

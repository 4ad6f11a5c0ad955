"""Built-in math tasks: small exact arithmetic problems, so the math recipe runs with no data.

Five families, each over small numbers: `a + b` and `a - b` (0..20), `a \\times b` (2..12),
`a + b \\times c` (1..9, operator precedence) and `\\frac{1}{a} + \\frac{1}{b}` (2..9, answered as a
reduced fraction). Answers are computed exactly with `Fraction`; the prompt asks for the answer in
`\\boxed{}`, which is what `math_reward` extracts.

This set tests the plumbing (prompt, completion, extracted answer, equivalence check), not a
model: the built-in tiny coder was warm-started on Python functions, not on arithmetic, so expect
a reward near 0 from it. Train a real model on your own problems with `data.path`. The split is a
hash of the task id, as for the code tasks; `3 + 5` and `5 + 3` are different tasks and may fall
in different splits.
"""

from __future__ import annotations

import itertools
from fractions import Fraction
from functools import cache

from areal.data.builtin import BuiltinTaskSource, Task, select

SMALL = range(0, 21)
FACTORS = range(2, 13)
DIGITS = range(1, 10)
DENOMINATORS = range(2, 10)


def latex(value: Fraction) -> str:
    """An exact answer as the reference writes it: `-3`, `\\frac{7}{12}`, `-\\frac{1}{2}`."""
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def _task(family: str, expr: str, value: Fraction) -> Task:
    return {
        "task_id": f"{family}/{expr}",
        "prompt": f"What is ${expr}$? Put your final answer within \\boxed{{}}.\n",
        "answer": latex(value),
    }


@cache
def _all_tasks() -> tuple[Task, ...]:
    tasks = [_task("add", f"{a} + {b}", Fraction(a + b)) for a, b in itertools.product(SMALL, SMALL)]
    tasks += [_task("sub", f"{a} - {b}", Fraction(a - b)) for a, b in itertools.product(SMALL, SMALL)]
    tasks += [_task("mul", f"{a} \\times {b}", Fraction(a * b)) for a, b in itertools.product(FACTORS, FACTORS)]
    tasks += [
        _task("order", f"{a} + {b} \\times {c}", Fraction(a + b * c))
        for a, b, c in itertools.product(DIGITS, DIGITS, DIGITS)
    ]
    tasks += [
        _task("frac", f"\\frac{{1}}{{{a}}} + \\frac{{1}}{{{b}}}", Fraction(1, a) + Fraction(1, b))
        for a, b in itertools.combinations_with_replacement(DENOMINATORS, 2)
    ]
    return tuple(tasks)


def builtin_math_tasks(split: str = "train", seed: int = 0, n: int | None = None) -> BuiltinTaskSource:
    """The built-in arithmetic tasks of `split` ({task_id, prompt, answer}); `n` keeps a subset chosen by `seed`."""
    return BuiltinTaskSource(select(_all_tasks(), split, seed, n, "builtin_math_tasks"), split, seed)

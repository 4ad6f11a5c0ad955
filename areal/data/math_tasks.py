"""Built-in math tasks: small exact arithmetic problems, so the math recipe runs with no data.

Five families, each over small numbers: `a + b` and `a - b` (0..20), `a \\times b` (2..12),
`a + b \\times c` (1..9, operator precedence) and `\\frac{1}{a} + \\frac{1}{b}` (2..9, answered as a
reduced fraction). Answers are computed exactly with `Fraction`; the prompt asks for the answer in
`\\boxed{}`, which is what `math_reward` extracts.

Each task also carries a worked `solution` (the products and sums it takes, then the boxed answer):
what the built-in `tiny-mather` was warm-started on, the train split only (models/builtin_weights.py),
so the math recipe starts from a model that answers some held-out tasks and not others. The split is
a hash of the task id, as for the code tasks; `3 + 5` and `5 + 3` are different tasks and may fall
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


def _task(family: str, expr: str, value: Fraction, steps: tuple[str, ...] = ()) -> Task:
    """`steps`: the solution's equations before the box, `expr = value` when not given."""
    answer = latex(value)
    worked = ", ".join(f"${step}$" for step in steps or (f"{expr} = {answer}",))
    return {
        "task_id": f"{family}/{expr}",
        "prompt": f"What is ${expr}$? Put your final answer within \\boxed{{}}.\n",
        "answer": answer,
        "solution": f"{worked}. \\boxed{{{answer}}}",
    }


def _order_task(a: int, b: int, c: int) -> Task:
    """`a + b \\times c`, worked as the product, then the sum."""
    product = b * c
    steps = (f"{b} \\times {c} = {product}", f"{a} + {product} = {a + product}")
    return _task("order", f"{a} + {b} \\times {c}", Fraction(a + product), steps)


def _fraction_task(a: int, b: int) -> Task:
    """`1/a + 1/b`, worked over the common denominator a*b, then reduced."""
    value = Fraction(1, a) + Fraction(1, b)
    expr = f"\\frac{{1}}{{{a}}} + \\frac{{1}}{{{b}}}"
    step = f"{expr} = \\frac{{{b} + {a}}}{{{a * b}}} = \\frac{{{a + b}}}{{{a * b}}}"
    if value.denominator != a * b:
        step += f" = {latex(value)}"
    return _task("frac", expr, value, (step,))


@cache
def _all_tasks() -> tuple[Task, ...]:
    tasks = [_task("add", f"{a} + {b}", Fraction(a + b)) for a, b in itertools.product(SMALL, SMALL)]
    tasks += [_task("sub", f"{a} - {b}", Fraction(a - b)) for a, b in itertools.product(SMALL, SMALL)]
    tasks += [_task("mul", f"{a} \\times {b}", Fraction(a * b)) for a, b in itertools.product(FACTORS, FACTORS)]
    tasks += [_order_task(a, b, c) for a, b, c in itertools.product(DIGITS, DIGITS, DIGITS)]
    tasks += [_fraction_task(a, b) for a, b in itertools.combinations_with_replacement(DENOMINATORS, 2)]
    return tuple(tasks)


def builtin_math_tasks(split: str = "train", seed: int = 0, n: int | None = None) -> BuiltinTaskSource:
    """The built-in arithmetic tasks of `split` ({task_id, prompt, answer}); `n` keeps a subset chosen by `seed`."""
    return BuiltinTaskSource(select(_all_tasks(), split, seed, n, "builtin_math_tasks"), split, seed)

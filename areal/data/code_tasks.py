"""Built-in code tasks: small Python functions to complete, with hidden tests.

Each task is a one-line comment and a signature (`# add 3 to x\\ndef f(x):\\n`); the model
writes the body (`    return x + 3\\n`) and the program scored is prompt + completion. Tasks come
from templates over a few variable names and small constants, in graded difficulty, so a model
that learned the templates on the train split can solve unseen instances of the test split.

The split is a hash of the task id, independent of the seed: train and test never share a task
for any seeds. Hidden tests are computed by running the reference solution in this process; it
is our own trusted code, never a model's.
"""

from __future__ import annotations

import copy
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from areal.data.builtin import BuiltinTaskSource, Task, digest, select

N_TESTS = 5
# a task's completion is a function body: it ends where the next def, comment, print or blank line begins
CODE_STOPS = ("\ndef ", "\n#", "\nprint", "\n\n")
INT_VARS = ("x", "n", "a", "k")
STR_VARS = ("s", "w", "t")
LIST_VARS = ("xs", "nums", "vals")
DIGITS = tuple(range(1, 10))
INT_ARGS = (-9, 20)  # an int argument of the hidden tests, when not drawn near the task's constants
LETTERS = tuple("abcdefgh")


@dataclass(frozen=True)
class Template:
    """A family of tasks: `comment` and `body` are formatted with the variable and constants."""

    name: str
    difficulty: int
    arg: str  # "int", "str" or "list": the kind of the single argument
    comment: str
    body: str
    params: dict[str, tuple[Any, ...]]


def _t(name: str, difficulty: int, arg: str, comment: str, body: str, **params: tuple[Any, ...]) -> Template:
    return Template(name, difficulty, arg, comment, body, params)


TEMPLATES = (
    # arithmetic with constants
    _t("add", 1, "int", "add {c} to {v}", "{v} + {c}", c=DIGITS),
    _t("sub", 1, "int", "subtract {c} from {v}", "{v} - {c}", c=DIGITS),
    _t("mul", 1, "int", "multiply {v} by {c}", "{v} * {c}", c=DIGITS),
    _t("floordiv", 1, "int", "{v} divided by {c}, rounded down", "{v} // {c}", c=DIGITS[1:]),
    _t("mod", 1, "int", "{v} modulo {c}", "{v} % {c}", c=DIGITS[1:]),
    _t("square", 1, "int", "{v} squared", "{v} * {v}"),
    _t("negate", 1, "int", "negate {v}", "-{v}"),
    # comparisons, abs, max, min
    _t("max", 1, "int", "max of {v} and {c}", "max({v}, {c})", c=DIGITS),
    _t("min", 1, "int", "min of {v} and {c}", "min({v}, {c})", c=DIGITS),
    _t("abs", 1, "int", "absolute value of {v}", "abs({v})"),
    _t("gt", 1, "int", "is {v} greater than {c}", "{v} > {c}", c=DIGITS),
    _t("lt", 1, "int", "is {v} less than {c}", "{v} < {c}", c=DIGITS),
    _t("eq", 1, "int", "is {v} equal to {c}", "{v} == {c}", c=DIGITS),
    _t("even", 1, "int", "is {v} even", "{v} % 2 == 0"),
    _t("divisible", 2, "int", "is {v} divisible by {c}", "{v} % {c} == 0", c=DIGITS[1:]),
    # string ops
    _t("reverse", 1, "str", "reverse the string {v}", "{v}[::-1]"),
    _t("upper", 1, "str", "{v} in upper case", "{v}.upper()"),
    _t("lower", 1, "str", "{v} in lower case", "{v}.lower()"),
    _t("repeat", 1, "str", "repeat {v} {c} times", "{v} * {c}", c=DIGITS),
    _t("prefix", 1, "str", "first {c} chars of {v}", "{v}[:{c}]", c=DIGITS),
    _t("suffix", 2, "str", "last {c} chars of {v}", "{v}[-{c}:]", c=DIGITS),
    _t("strlen", 1, "str", "length of {v}", "len({v})"),
    _t("append", 1, "str", "{v} with '{ch}' added at the end", "{v} + '{ch}'", ch=LETTERS),
    _t("startswith", 2, "str", "does {v} start with '{ch}'", "{v}.startswith('{ch}')", ch=LETTERS),
    _t("count_char", 2, "str", "count of '{ch}' in {v}", "{v}.count('{ch}')", ch=LETTERS),
    # list ops
    _t("sum", 1, "list", "sum of {v}", "sum({v})"),
    _t("len", 1, "list", "length of {v}", "len({v})"),
    _t("sorted", 1, "list", "{v} sorted", "sorted({v})"),
    _t("largest", 1, "list", "largest item of {v}", "max({v})"),
    _t("smallest", 1, "list", "smallest item of {v}", "min({v})"),
    _t("first", 1, "list", "first item of {v}", "{v}[0]"),
    _t("count_item", 2, "list", "how many times {c} is in {v}", "{v}.count({c})", c=DIGITS),
    _t("evens", 2, "list", "even numbers in {v}", "[v for v in {v} if v % 2 == 0]"),
    _t("odds", 2, "list", "odd numbers in {v}", "[v for v in {v} if v % 2 == 1]"),
    _t("above", 2, "list", "items of {v} greater than {c}", "[v for v in {v} if v > {c}]", c=DIGITS),
    _t("add_each", 2, "list", "add {c} to each item of {v}", "[v + {c} for v in {v}]", c=DIGITS),
    _t("mul_each", 2, "list", "multiply each item of {v} by {c}", "[v * {c} for v in {v}]", c=DIGITS),
    # conditionals
    _t(
        "pick",
        2,
        "int",
        "{a} if {v} is greater than {c}, else {b}",
        "{a} if {v} > {c} else {b}",
        a=DIGITS[:3],
        b=DIGITS[6:],
        c=DIGITS[::3],
    ),
    _t("even_or", 2, "int", "{v} if {v} is even, else {c}", "{v} if {v} % 2 == 0 else {c}", c=DIGITS),
    _t("sign_word", 2, "int", "'pos' if {v} > 0, else 'neg'", "'pos' if {v} > 0 else 'neg'"),
    # composition of two ops
    _t("add_double", 3, "int", "add {c} to {v}, then double it", "({v} + {c}) * 2", c=DIGITS),
    _t("mul_add", 3, "int", "multiply {v} by {c}, then add {d}", "{v} * {c} + {d}", c=DIGITS[1:6], d=DIGITS[:4]),
    _t("abs_diff", 3, "int", "absolute value of {v} minus {c}", "abs({v} - {c})", c=DIGITS),
    _t("rev_upper", 3, "str", "reverse {v}, then upper case", "{v}[::-1].upper()"),
    _t("repeat_rev", 3, "str", "{v} reversed, repeated {c} times", "{v}[::-1] * {c}", c=DIGITS[1:]),
    _t("sum_times", 3, "list", "sum of {v}, times {c}", "sum({v}) * {c}", c=DIGITS[1:]),
    _t("len_plus", 3, "list", "length of {v}, plus {c}", "len({v}) + {c}", c=DIGITS),
    _t("max_plus", 3, "list", "largest item of {v}, plus {c}", "max({v}) + {c}", c=DIGITS),
    _t("sorted_head", 3, "list", "the {c} smallest items of {v}, sorted", "sorted({v})[:{c}]", c=DIGITS[:5]),
    _t("count_evens", 3, "list", "how many even numbers in {v}", "len([v for v in {v} if v % 2 == 0])"),
)

_VARS = {"int": INT_VARS, "str": STR_VARS, "list": LIST_VARS}


def _random_arg(kind: str, rng: random.Random, consts: dict[str, Any]) -> Any:
    """One argument value; values near the task's constants, so comparisons go both ways."""
    if kind == "int":
        near = [v for v in consts.values() if isinstance(v, int)]
        if near and rng.random() < 0.5:
            return rng.choice(near) + rng.randint(-2, 2)
        return rng.randint(*INT_ARGS)
    if kind == "str":
        letters = "".join(v for v in consts.values() if isinstance(v, str)) + "abcdeXYZ"
        return "".join(rng.choice(letters) for _ in range(rng.randint(1, 7)))
    pool = [v for v in consts.values() if isinstance(v, int)] + list(range(-3, 13))
    return [rng.choice(pool) for _ in range(rng.randint(1, 6))]


def _hidden_tests(fn: Callable[..., Any], kind: str, task_id: str, consts: dict[str, Any]) -> dict[str, Any]:
    """N_TESTS cases whose outputs are not all equal, so a constant answer fails."""
    rng = random.Random(digest("tests:" + task_id))
    for _ in range(100):
        inputs = [[_random_arg(kind, rng, consts)] for _ in range(N_TESTS)]
        outputs = [fn(*copy.deepcopy(args)) for args in inputs]
        if len({repr(o) for o in outputs}) > 1:
            return {"kind": "call", "fn_name": "f", "inputs": inputs, "outputs": outputs}
    raise AssertionError(f"task {task_id}: no input set tells its outputs apart")


def reference_task(task_id: str, prompt: str, solution: str, kind: str, consts: dict[str, Any],
                   difficulty: int) -> Task:
    """A task whose hidden tests are what our own `prompt + solution` returns on inputs of `kind`."""
    namespace: dict[str, Any] = {}
    exec(compile(prompt + solution, f"<task {task_id}>", "exec"), namespace)  # our own reference code
    return {
        "task_id": task_id,
        "prompt": prompt,
        "tests": _hidden_tests(namespace["f"], kind, task_id, consts),
        "solution": solution,
        "difficulty": difficulty,
    }


def _make_task(template: Template, var: str, consts: dict[str, Any]) -> Task:
    fields = {"v": var, **consts}
    task_id = "/".join([template.name, var, *(f"{k}={v}" for k, v in consts.items())])
    prompt = f"# {template.comment.format(**fields)}\ndef f({var}):\n"
    solution = f"    return {template.body.format(**fields)}\n"
    return reference_task(task_id, prompt, solution, template.arg, consts, template.difficulty)


@cache
def _all_tasks() -> tuple[Task, ...]:
    tasks = []
    for template in TEMPLATES:
        keys = list(template.params)
        for var in _VARS[template.arg]:
            for values in itertools.product(*(template.params[k] for k in keys)):
                tasks.append(_make_task(template, var, dict(zip(keys, values))))
    return tuple(tasks)


def builtin_code_tasks(split: str = "train", seed: int = 0, n: int | None = None) -> BuiltinTaskSource:
    """The built-in tasks of `split`; `n` keeps a subset of n tasks chosen by `seed`."""
    return BuiltinTaskSource(select(_all_tasks(), split, seed, n, "builtin_code_tasks"), split, seed, CODE_STOPS)

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from areal.rewards.math_answer import MathResult, MathReward, answers_equivalent, extract_answer
from areal.rewards.math_symbolic import SymbolicChecker

pytest.importorskip("sympy")


@pytest.fixture(scope="module")
def reward() -> Iterator[MathReward]:
    with MathReward(timeout_s=2.0) as scorer:
        yield scorer
    assert scorer.checker.pid is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so the result is $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
        (r"first \boxed{3}, then corrected: \boxed{4}", "4"),
        (r"\boxed{\{1, 2\}} holds braces", r"\{1, 2\}"),
        (r"nested \boxed{\frac{a^{2}}{\sqrt{b}}} end", r"\frac{a^{2}}{\sqrt{b}}"),
        (r"the box: \fbox{7}", "7"),
        (r"\boxed 5 is short", "5"),
        ("The final answer is 12. I hope it is correct.", "12"),
        ("Final Answer: The final answer is $3.5$. I hope it is correct.", "3.5"),
        ("**Final answer:** 42", "42"),
        ("Reasoning...\nAnswer: x = 7\nDone", "x = 7"),
        ("Janet pays 5 + 3 = 8 dollars.\n#### 8", "8"),
        (r"unbalanced \boxed{2 then Answer: 9", "9"),
        ("I could not solve it.", None),
        ("", None),
    ],
)
def test_extract_answer_takes_the_last_boxed_else_an_answer_line(text, expected):
    assert extract_answer(text) == expected


EQUIVALENT = [
    ("5", "5"),
    (r"\frac{1}{2}", "0.5"),
    (r"\dfrac{1}{2}", "1/2"),
    (r"\frac12", "0.5"),
    (r"-\frac{3}{4}", "-0.75"),
    ("0.50", ".5"),
    ("1,000", "1000"),
    (r"1{,}000", "1000"),
    (r"50\%", "0.5"),
    ("50%", "50"),
    ("1.5e3", "1500"),
    (r"1.5 \times 10^{3}", "1500"),
    (r"$\left( 3 \right)$", "3"),
    (r"10\text{ cm}", "10"),
    (r"12\text{ m}^2", "12"),
    (r"90^\circ", "90"),
    (r"\text{Monday}", "Monday"),
    ("x = 3", "3"),
    ("(B)", "B"),
    ("7.", "7"),
    (r"\boxed{2}", "2"),
    (r"\sqrt{8}", r"2\sqrt{2}"),
    (r"\frac{\sqrt{3}}{2}", r"\sqrt{3}/2"),
    (r"\sqrt[3]{8}", "2"),
    ("sqrt(2)/2", r"\frac{1}{\sqrt{2}}"),
    (r"\pi r^2", r"r^{2}\pi"),
    (r"2\pi", "6.283185307179586"),
    ("x^2+2x+1", "(x+1)^2"),
    (r"\frac{x}{2} + \frac{x}{3}", r"\frac{5x}{6}"),
    (r"2 \cdot 3!", "12"),
    ("(1, 2]", "(1,2]"),
    (r"[0, \infty)", r"[0,\infty)"),
    ("2, 1", "1, 2"),
    ("(1, 2)", "(1.0, 2)"),
]

DIFFERENT = [
    ("5", "6"),
    (r"\frac{1}{3}", "0.333"),
    ("0.5", "5"),
    (r"\sqrt{2}", "1.41"),
    (r"\pi", "3.14"),
    ("[1, 2)", "(1, 2)"),
    ("(1, 2)", "(2, 1)"),
    ("1, 2", "1, 2, 3"),
    ("x^2 + 1", "(x+1)^2"),
    (r"-\infty", r"\infty"),
    ("Monday", "Mondya"),
    ("B", "C"),
    ("", "0"),
    ("2x", "2y"),
]


@pytest.mark.parametrize(("predicted", "reference"), EQUIVALENT)
def test_equivalent_answers_are_equal_both_ways(predicted, reference):
    assert answers_equivalent(predicted, reference)
    assert answers_equivalent(reference, predicted)


@pytest.mark.parametrize(("predicted", "reference"), DIFFERENT)
def test_different_answers_are_not_equal(predicted, reference):
    assert not answers_equivalent(predicted, reference)


def test_a_formula_is_never_evaluated_as_python():
    marker = "areal_math_pwned"
    assert not answers_equivalent(f"__import__('os').system('touch {marker}')", "0")
    assert not os.path.exists(marker)


def test_adversarial_power_returns_false_within_the_timeout_and_the_checker_recovers():
    checker = SymbolicChecker()
    try:
        assert checker.check("x+x", "2x", timeout_s=5.0) == "equal"  # started: the startup is not timed
        first = checker.pid
        start = time.monotonic()
        assert checker.check("10^{10^{10}}", "1", timeout_s=0.5) == "timeout"
        elapsed = time.monotonic() - start
        assert elapsed < 0.5 + 1.0, elapsed
        with pytest.raises(ProcessLookupError):
            os.kill(first, 0)  # killed and reaped, not left spinning
        assert checker.check(r"\sqrt{4}", "2", timeout_s=5.0) == "equal"  # a fresh child
        assert checker.pid != first
    finally:
        checker.close()


def test_reward_scores_extracts_and_names_the_reason(reward):
    completions = [
        r"... so $\boxed{\frac{1}{2}}$",
        "The answer follows.\n#### 0.5",
        r"\boxed{3}",
        "no idea",
        r"\boxed{10^{10^{10}}}",
    ]
    reward.timeout_s = 0.5
    try:
        results = reward(completions, ["0.5", r"Since 2x = 1, x = \boxed{\dfrac12}.", "4", "1", "1"])
    finally:
        reward.timeout_s = 2.0
    assert results == [
        MathResult(1.0, None, r"\frac{1}{2}"),
        MathResult(1.0, None, "0.5"),
        MathResult(0.0, "wrong_answer", "3"),
        MathResult(0.0, "no_answer", None),
        MathResult(0.0, "check_timeout", "10^{10^{10}}"),
    ]


def test_reward_declares_its_inputs_and_rejects_unequal_lengths(reward):
    assert reward.input_names == ("completion", "answer")
    with pytest.raises(ValueError, match="2 completions but 1 answers"):
        reward(["a", "b"], ["c"])

"""Refusals that need no judge: hedges, arithmetic left undone, restated questions, the wrong form."""

from __future__ import annotations

import pytest

from areal.rewards.math.rules import refusal


@pytest.mark.parametrize(
    ("answer", "hedge"),
    [
        (r"5 \text{ (or possibly 6)}", "or"),
        (r"12 \text{ (or 13 if we count the endpoint)}", "or"),
        (r"5 \text{ (approximately)}", "approximately"),
        (r"\approx 5", r"\approx"),
        ("5?", "?"),
        (r"\text{at least } 10", "least"),
        (r"3 \text{ (assuming } x > 0)", "assuming"),
        ("not 12 but 13", "not"),
    ],
)
def test_a_hedge_is_refused_even_where_math_verify_drops_it_as_a_unit(answer, hedge):
    assert refusal(answer, "5") == ("hedged_answer", f"the answer hedges ({hedge!r})")


def test_units_alternatives_of_a_list_and_the_references_own_words_are_not_hedges():
    assert refusal(r"10 \text{ cm}", "10") is None and refusal(r"10 \text{ (in cm)}", "10") is None
    assert refusal(r"2 \text{ or } 3", "2, 3") is None
    assert refusal(r"\text{does not exist}", r"\text{does not exist}") is None
    assert refusal(r"\frac{1}{3} \approx 0.333", r"\frac{1}{3}") is None  # an exact value, then a gloss


def test_arithmetic_left_undone_is_refused_without_a_prompt():
    assert refusal(r"17 \times 23", "391") == (
        "unevaluated_answer", r"the answer '17 \\times 23' is arithmetic left undone")
    assert refusal("12 - 5", "7")[0] == "unevaluated_answer"
    assert refusal(r"2 \times 3 = 6", "6") is None  # the computation, then the value
    assert refusal("2^{10}", "1024") is None and refusal(r"2 \times 10^6", "2000000") is None  # closed forms


def test_the_questions_own_expression_is_refused_when_the_prompt_is_given():
    prompt = r"What is $17 \times 23$?"
    assert refusal(r"23 \times 17", "391", prompt)[0] == "unevaluated_answer"
    assert refusal("2^{10}", "1024", r"Compute $2^{10}$.") == (
        "restated_question", "the answer '2^{10}' is the question's own arithmetic, not its value")
    assert refusal("2^{10}", "1024", "How many subsets does a set with 10 elements have?") is None
    factor = r"Factor $x^2 + 5x + 6$."
    assert refusal("x^2 + 5x + 6", "(x+2)(x+3)", factor) == (
        "restated_question", "the answer 'x^2 + 5x + 6' is copied from the question")
    assert refusal("(x+3)(x+2)", "(x+2)(x+3)", factor) is None
    assert refusal("x = 2", "2", r"If $2x + y = 6$ and $x = 2$, what is $y$?")[0] == "restated_question"
    assert refusal(r"\frac{6}{8}", r"\frac{3}{4}", r"Simplify $\frac{6}{8}$.")[0] == "restated_question"


def test_a_value_that_appears_in_the_prompt_is_still_an_answer():
    prompt = "A coin lands heads with probability 1/2. What is the probability that it lands tails?"
    assert refusal("1/2", r"\frac{1}{2}", prompt) is None and refusal("0.5", r"\frac{1}{2}", prompt) is None
    assert refusal("391", "391", r"What is $17 \times 23$?") is None


def test_the_form_the_prompt_asks_for():
    fraction = "What is the probability of two heads? Express your answer as a common fraction."
    assert refusal("0.25", r"\frac{1}{4}", fraction) == (
        "wrong_form", "the prompt asks for a fraction; '0.25' is a decimal")
    assert refusal(r"\frac{2}{8}", r"\frac{1}{4}", fraction)[0] == "wrong_form"
    assert refusal("1/4", r"\frac{1}{4}", fraction) is None
    assert refusal("3/8", "0.375", r"Express $\frac{3}{8}$ as a decimal.")[0] == "wrong_form"
    assert refusal(r"\frac{3}{8}", "0.375", "Write three eighths as a decimal.")[0] == "wrong_form"

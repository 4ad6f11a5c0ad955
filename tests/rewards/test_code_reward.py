"""Correct and ordinary-wrong programs, both test formats, both reward modes, and the layer gate."""

from __future__ import annotations

import dataclasses

import pytest

from areal.rewards import CodeResult, CodeTests, SandboxError, code_reward, code_tests, detect_layers, extract_code
from areal.rewards.code_reward import normalise_stdout, results_equal

ADD = {"kind": "call", "fn_name": "add", "inputs": [[1, 2], [3, 4], [-1, 1]], "outputs": [3, 7, 0]}
SUM = {"kind": "stdio", "inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7"]}
HALF_RIGHT = "def add(a, b):\n    return a + b if a > 0 else 99\n"


def test_extract_code_takes_the_last_python_fence_else_the_text():
    completion = "Try:\n```python\nx = 1\n```\nBetter:\n```python\nx = 2\n```\n```text\nout\n```"
    assert extract_code(completion) == "x = 2\n"
    assert extract_code("```\nprint(3)\n```") == "print(3)\n"
    assert extract_code("print(3)") == "print(3)"


def test_stdout_is_compared_without_trailing_whitespace_or_blank_lines():
    assert normalise_stdout("3  \r\n4\n\n\n") == normalise_stdout("3\n4") == "3\n4"
    assert normalise_stdout(" 3") != normalise_stdout("3")


def test_correct_programs_pass_in_both_formats_fenced_or_not(sandbox):
    programs = [
        "```python\ndef add(a, b):\n    return a + b\n```",
        "class Solution:\n    def add(self, a, b):\n        return a + b\n",
        "a, b = map(int, input().split())\nprint(a + b, ' ')\n",
    ]
    results = sandbox(programs, [ADD, ADD, SUM])
    assert results == [
        CodeResult(1.0, 3, 3, None, ""),
        CodeResult(1.0, 3, 3, None, ""),
        CodeResult(1.0, 2, 2, None, ""),
    ]


def test_fraction_mode_scores_the_share_passed_and_all_mode_only_a_full_pass(sandbox):
    (fraction,) = sandbox([HALF_RIGHT], [ADD])
    with CodeTests(timeout_s=1.0, mode="all", workers=1) as all_or_nothing:
        (strict,) = all_or_nothing([HALF_RIGHT], [ADD])
    assert (fraction.reward, fraction.passed, fraction.reason) == (pytest.approx(2 / 3), 2, "wrong_answer")
    assert fraction.detail == "expected 0, got 99"
    assert dataclasses.replace(strict, reward=fraction.reward) == fraction
    assert strict.reward == 0.0


def test_a_syntax_error_fails_every_test_with_its_line(sandbox):
    (result,) = sandbox(["def add(a, b)\n    return a + b\n"], [ADD])
    assert result == CodeResult(0.0, 0, 3, "syntax_error", "SyntaxError: expected ':' (line 1)")


def test_a_crash_names_the_exception_and_other_tests_still_run(sandbox):
    program = "def add(a, b):\n    return a // (b - 1) * 0 + a + b\n"  # b == 1 divides by zero
    (result,) = sandbox([program], [ADD])
    assert (result.passed, result.reason) == (2, "crash")
    assert result.detail == "ZeroDivisionError: integer division or modulo by zero"


def test_a_missing_function_and_an_unserialisable_result_fail_clearly(sandbox):
    results = sandbox(
        ["def plus(a, b):\n    return a + b\n", "def add(a, b):\n    return {a, b}\n"], [ADD, ADD]
    )
    assert (results[0].reason, results[0].detail) == (
        "crash",
        "NameError: the program defines no function 'add' (nor Solution.add)",
    )
    assert results[1].reason == "wrong_answer"
    assert results[1].detail.startswith("result is not JSON-serialisable")


def test_tuples_compare_equal_to_lists_as_json_does(sandbox):
    tests = {"kind": "call", "fn_name": "pair", "inputs": [[1]], "outputs": [[1, 2]]}
    (result,) = sandbox(["def pair(x):\n    return (x, x + 1)\n"], [tests])
    assert result.reward == 1.0


def test_malformed_tests_fail_their_own_sample_as_a_broken_check_and_the_others_are_scored(sandbox):
    right = "a, b = map(int, input().split())\nprint(a + b)\n"
    results = sandbox([right, right, right], [{"kind": "stdio", "inputs": ["1"], "outputs": []}, SUM, None])
    assert [(r.reason, r.total) for r in results] == [("check_failed", 0), (None, 2), ("check_failed", 0)]
    assert "as many outputs as inputs" in results[0].detail and "tests are a dict, got NoneType" in results[2].detail
    with pytest.raises(ValueError, match="2 programs but 1 test dicts"):
        sandbox(["a", "b"], [SUM])


def test_the_sandbox_reports_every_layer_active_here():
    layers = detect_layers()
    if layers.missing:
        pytest.skip(f"full sandbox unavailable here: {layers.describe()}")
    assert layers.uid != 0
    assert "user+PID+network+IPC namespaces" in layers.describe()
    assert "missing" not in layers.describe()


def test_missing_layers_refuse_untrusted_code_unless_the_caller_opts_in(monkeypatch):
    weak = dataclasses.replace(
        detect_layers(), bwrap=None, namespaces=False, problem="no bubblewrap found"
    )
    monkeypatch.setattr(code_reward, "detect_layers", lambda: weak)
    refusing = code_tests(timeout_s=1.0)  # building it probes nothing: the first call does
    with pytest.raises(SandboxError, match=r"missing PID namespace, network namespace \(no bubblewrap found\)\. "
                       r"Ways out: .*allow_weaker=True"):
        refusing(["print(1)"], [SUM])
    with code_tests(timeout_s=1.0, allow_weaker=True, workers=1) as weaker:
        results = weaker(
            ["def add(a, b):\n    return a + b\n", "import socket\nsocket.socket()\n"],
            [ADD, {"kind": "stdio", "inputs": [""], "outputs": [""]}],
        )
    assert results[0].reward == 1.0
    assert (results[1].reason, results[1].detail) == (
        "crash",
        "PermissionError: network access is not allowed in the sandbox",
    )


def test_building_the_reward_probes_nothing_until_programs_run(monkeypatch):
    probes = []
    monkeypatch.setattr(code_reward, "detect_layers", lambda: probes.append(1) or detect_layers())
    scorer = code_tests(timeout_s=1.0)  # what every worker does when it loads the recipe
    assert probes == []
    scorer.preflight()
    scorer.preflight()
    assert probes == [1]  # once per process
    scorer.close()


def test_a_sandbox_that_cannot_start_is_a_sandbox_error_not_a_zero(monkeypatch):
    broken = dataclasses.replace(detect_layers(), python="/nonexistent/python3")
    monkeypatch.setattr(code_reward, "detect_layers", lambda: broken)
    with code_tests(timeout_s=1.0, allow_weaker=True, workers=1) as scorer:
        (result,) = scorer(["print(1)"], [SUM])
    assert (result.reward, result.reason) == (0.0, "sandbox_error")


def test_a_detail_from_inside_is_one_short_printable_line(sandbox):
    # cursor up, erase the line, a bidi override and a bell, then a fake verdict and a flood
    line = "\x1b[1A\x1b[2K\u202e\x07PASSED all tests" + "x" * 2000
    program = f"import os, sys\nsys.stderr.write({line!r} + '\\x1b[0m\\n')\nsys.stderr.flush()\nos._exit(5)\n"
    (result,) = sandbox([program], [SUM])
    assert (result.reward, result.reason) == (0.0, "crash")
    assert result.detail.isprintable() and len(result.detail) <= 200, result.detail
    assert result.detail.startswith("\\x1b[1A\\x1b[2K\\u202e\\x07PASSED all tests")


@pytest.mark.parametrize(
    ("got", "expected", "equal"),
    [
        (True, 1, False),  # a predicate does not answer a count
        (1, True, False),
        (False, 0, False),
        (True, True, True),
        (2.0, 2, False),  # an integer asked for, a float given: / where // was meant
        (2, 2.0, True),  # a float asked for: an int of that value answers it
        (0.30000000000000004, 0.3, True),  # the same sum in another order
        (0.3001, 0.3, False),
        (1e-17, 0.0, True),
        (float("nan"), float("nan"), True),
        (1, float("nan"), False),
        (10**400, 1.5, False),  # past any float
        ("1", 1, False),
        (None, None, True),
        (None, 0, False),
        ([1, True], [1, 1], False),
        ([1, 2.0], [1, 2.0], True),
        ([1, 2], [1, 2, 3], False),
        ({"a": [1.0]}, {"a": [1]}, False),
        ({"a": [1]}, {"a": [1.0]}, True),
        ({"a": 1}, {"a": 1, "b": 2}, False),
    ],
)
def test_a_result_must_be_of_the_expected_kind_as_well_as_equal(got, expected, equal):
    assert results_equal(got, expected) is equal


def test_a_bool_or_float_returned_where_an_int_is_expected_is_a_wrong_answer(sandbox):
    tests = {"kind": "call", "fn_name": "count", "inputs": [[1], [6]], "outputs": [1, 6]}
    programs = ["def count(x):\n    return x >= 0\n", "def count(x):\n    return x / 1\n",
                "def count(x):\n    return x\n"]
    predicate, real, right = sandbox(programs, [tests] * 3)
    assert (predicate.reward, predicate.reason, predicate.detail) == (0.0, "wrong_answer", "expected 1, got True")
    assert (real.reward, real.detail) == (0.0, "expected 1, got 1.0")
    assert right.reward == 1.0

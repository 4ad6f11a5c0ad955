"""Identical jobs run once per call, repeatable results are reused across calls, the rest run afresh.

This is bookkeeping, so it is tested without a sandbox: `Scripted` answers each job the way the
sandbox's harness would, from trusted test programs run in this process (a spinning one reads
as a timeout). The sandbox itself is tested in test_code_reward.py and test_hostile.py.
"""

from __future__ import annotations

import json

from areal.rewards import CodeTests
from areal.rewards.sandbox.layers import SandboxRun

ADD = {"kind": "call", "fn_name": "add", "inputs": [[1, 2], [3, 4]], "outputs": [3, 7]}
RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
SPIN = "def add(a, b):\n    while True:\n        pass\n"


class Scripted(CodeTests):
    """The reward's bookkeeping over a stand-in for the sandbox (our own programs only)."""

    def __init__(self, **kw) -> None:
        super().__init__(pooled=False, **kw)

    def preflight(self) -> None:
        pass  # nothing untrusted runs

    def _execute(self, job: dict) -> SandboxRun:
        if "while True" in job["code"]:
            return SandboxRun(ready=True, ended="timeout")
        namespace: dict = {}
        exec(job["code"], namespace)
        outs = [json.dumps(namespace[job["fn_name"]](*args)) for args in job["inputs"]]
        return SandboxRun(ready=True, records={i: {"status": "ok", "out": out} for i, out in enumerate(outs)})


def test_a_group_with_repeated_programs_runs_each_distinct_one_once():
    with Scripted(timeout_s=1.0, workers=2) as scorer:
        results = scorer([RIGHT, WRONG, RIGHT, RIGHT, f"```python\n{RIGHT}```"], [ADD] * 5)
        assert [r.reward for r in results] == [1.0, 0.0, 1.0, 1.0, 1.0]
        assert scorer.programs_run == 2  # the fenced copy extracts to the same code


def test_repeatable_results_are_reused_across_calls_and_timeouts_are_run_again():
    with Scripted(timeout_s=0.3, workers=2) as scorer:
        first = scorer([RIGHT, WRONG, SPIN], [ADD] * 3)
        again = scorer([WRONG, RIGHT, SPIN], [ADD] * 3)
        assert [r.reason for r in first] == [None, "wrong_answer", "timeout"]
        assert again == [first[1], first[0], first[2]]
        assert scorer.programs_run == 4  # RIGHT and WRONG once, SPIN twice


def test_the_expected_outputs_are_part_of_what_is_remembered():
    other = {**ADD, "outputs": [3, 8]}
    with Scripted(timeout_s=1.0, workers=1) as scorer:
        (full,) = scorer([RIGHT], [ADD])
        (half,) = scorer([RIGHT], [other])
    assert (full.reward, half.reward, half.reason) == (1.0, 0.5, "wrong_answer")
    assert scorer.programs_run == 2


def test_only_the_last_remember_results_are_kept():
    programs = [f"def add(a, b):\n    return a + b + {k}\n" for k in range(3)]
    with Scripted(timeout_s=1.0, workers=1, remember=2) as scorer:
        scorer(programs, [ADD] * 3)
        scorer(programs[1:], [ADD] * 2)  # both still remembered
        assert scorer.programs_run == 3
        scorer(programs[:1], [ADD])  # the oldest was dropped: it runs again
        assert scorer.programs_run == 4


def test_remember_zero_still_runs_a_repeated_program_once_per_call():
    with Scripted(timeout_s=1.0, workers=1, remember=0) as scorer:
        scorer([RIGHT, RIGHT], [ADD] * 2)
        scorer([RIGHT], [ADD])
        assert scorer.programs_run == 2

"""The HumanEval reward: a completion passes when the problem's own `check(candidate)` accepts it, in the sandbox.

The program run is the problem's prompt (its imports, helpers and the function's signature), then
the model's code, then HumanEval's test program, then a small entry function that calls
`check(<entry point>)` and returns True. It runs as one "call" test of `CodeTests` (sandboxed, with
its timeout and memory limit): a failed assertion, an exception or a timeout is a failure, and only a
`check` that returns normally passes. As in HumanEval's own harness, a test passes on the absence of
an exception: a program that rewrites `check` or the builtins it relies on is not defended against.
The problem's own `check` is the judge, so its `==` decides (`True` passes where 1 is expected);
`CodeTests`' stricter rule applies only to the True the entry function returns.

The model's code is found the way each prompt style asks for it (`areal/data/humaneval.py`): the
last fenced block of a chat reply, else the completion as written. Code that defines the entry point
itself (a whole function) follows the prompt, whose stub it replaces; anything else (a base
model's function body) continues the prompt directly.
"""

from __future__ import annotations

import re
from typing import Any

from areal.rewards.code_reward import CodeResult, CodeTests, extract_code

ENTRY = "__areal_humaneval__"
CALL = {"kind": "call", "fn_name": ENTRY, "inputs": [[]], "outputs": [True]}


def humaneval_program(completion: str, tests: dict[str, Any]) -> str:
    """The whole program that is run for one completion of one problem (see the module docstring)."""
    code = extract_code(completion)
    defines_entry = re.search(rf"^def\s+{re.escape(tests['entry_point'])}\s*\(", code, re.MULTILINE)
    solution = f"{tests['prompt']}\n\n{code}" if defines_entry else tests["prompt"] + code
    return f"{solution}\n\n\n{tests['test']}\n\n\ndef {ENTRY}():\n    check({tests['entry_point']})\n    return True\n"


class HumanEvalTests:
    """Scores completions of HumanEval tasks: reward 1.0 when `check` passes, else 0.0 with the reason.

    `timeout_s` bounds one problem's whole test program (HumanEval's own harness gives 3 s).
    """

    input_names = ("completion", "tests")

    def __init__(self, timeout_s: float = 3.0, **code_tests: Any) -> None:
        self.code = CodeTests(timeout_s=timeout_s, mode="all", **code_tests)

    def __call__(self, completions: list[str], tests: list[dict[str, Any]]) -> list[CodeResult]:
        if len(completions) != len(tests):
            raise ValueError(f"humaneval_tests: {len(completions)} completions but {len(tests)} test dicts")
        for t in tests:
            if not isinstance(t, dict) or t.get("kind") != "humaneval":
                raise ValueError(f"humaneval_tests: expected the tests of a HumanEval task (kind 'humaneval'), "
                                 f"got {t!r:.120}; use humaneval_tasks() as the source")
        return self.code([humaneval_program(c, t) for c, t in zip(completions, tests)], [CALL] * len(tests))

    def preflight(self) -> None:
        """Refuse now if the sandbox cannot run (see `CodeTests.preflight`)."""
        self.code.preflight()

    def close(self) -> None:
        self.code.close()

    def __enter__(self) -> HumanEvalTests:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def humaneval_tests(timeout_s: float = 3.0, **code_tests: Any) -> HumanEvalTests:
    """The HumanEval reward a recipe plugs in: `reward("score", humaneval_tests())`."""
    return HumanEvalTests(timeout_s=timeout_s, **code_tests)

"""Code repair on the built-in tasks: public tests the model is told about, hidden tests that score it.

A repair episode (recipes/code_repair.py) shows the model the failure of its program on the public
tests and lets it try again; the reward is the hidden tests of its last program. The first
PUBLIC_TESTS of a task's tests are public, the rest hidden, so passing the public ones never proves
the hidden ones pass.

The feedback is one comment line, then the task's prompt again, so the model writes a fresh body
with the task in view (a model that ignored the feedback line would do as well as a fresh try):

    # wrong_answer: expected 5, got 6
    # add 4 to x
    def f(x):

`repair_examples` builds the warm start's repair data (the built-in `tiny-repairer`): a task's
prompt, a wrong body taken from another task with the same argument, that body's feedback on the
task's public tests, and the right body. Only the right body is trained, so the model learns to
answer feedback, never to write the wrong body. The wrong bodies are our own reference solutions,
run in this process like the tasks' own.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from typing import Any

PUBLIC_TESTS = 2
FEEDBACK_CHARS = 60  # of the failure's detail: a repair episode's context stays within a small model's


def split_tests(tests: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(public, hidden): the first PUBLIC_TESTS cases and the rest, each a tests dict of its own."""
    inputs, outputs = list(tests["inputs"]), list(tests["outputs"])
    if len(inputs) <= PUBLIC_TESTS:
        raise ValueError(f"code repair needs more than {PUBLIC_TESTS} tests per task (public and hidden ones), "
                         f"got {len(inputs)}")
    public = {**tests, "inputs": inputs[:PUBLIC_TESTS], "outputs": outputs[:PUBLIC_TESTS]}
    hidden = {**tests, "inputs": inputs[PUBLIC_TESTS:], "outputs": outputs[PUBLIC_TESTS:]}
    return public, hidden


def signature(prompt: str) -> str:
    """The prompt's last line (`def f(x):`): tasks that share it take the same argument."""
    return prompt.rstrip("\n").rsplit("\n", 1)[-1] + "\n"


def feedback(result: Any, prompt: str) -> str:
    """What the model reads after a failed attempt (`result`: the code reward's CodeResult on the public tests):
    its first failure, then the prompt."""
    if result.reason is None:
        raise ValueError("feedback is for a failed attempt; this one passed")
    return _said(result.reason, result.detail, prompt)


def _said(reason: str, detail: str, prompt: str) -> str:
    detail = detail if len(detail) <= FEEDBACK_CHARS else detail[: FEEDBACK_CHARS - 1] + "…"
    return f"# {reason}: {detail}\n{prompt}"


def repair_examples(tasks: Sequence[Mapping[str, Any]], seed: int) -> list[dict[str, Any]]:
    """One repair example per task that has a wrong body to learn from: {prompt, attempts, solution}."""
    rng = random.Random(seed)
    by_signature: dict[str, list[Mapping[str, Any]]] = {}
    for task in tasks:
        by_signature.setdefault(signature(task["prompt"]), []).append(task)
    examples = []
    for task in tasks:
        public, _ = split_tests(task["tests"])
        others = [t for t in by_signature[signature(task["prompt"])] if t["solution"] != task["solution"]]
        rng.shuffle(others)
        if rng.random() < 0.5:  # half the time a near miss first: the same template, other constants
            others.sort(key=lambda t: _template(t) != _template(task))
        for other in others[:8]:  # the first whose body fails a public test
            detail = _first_failure(task["prompt"], other["solution"], public)
            if detail is not None:
                examples.append({"prompt": task["prompt"], "solution": task["solution"],
                                 "attempts": [(other["solution"], _said("wrong_answer", detail, task["prompt"]))]})
                break
    return examples


def _template(task: Mapping[str, Any]) -> str:
    return str(task.get("task_id", "")).split("/")[0]


def _first_failure(prompt: str, body: str, tests: Mapping[str, Any]) -> str | None:
    """The wrong-answer detail of `body` on the first test it fails, worded as the code reward words it
    (rewards/code_reward.py; tests/data/test_code_repair.py checks that the two agree); None if it passes them all
    or fails otherwise (a crash reads differently; those bodies are skipped)."""
    namespace: dict[str, Any] = {}
    exec(compile(prompt + body, "<repair example>", "exec"), namespace)  # our own reference code
    for args, expected in zip(tests["inputs"], tests["outputs"]):
        try:
            got = json.loads(json.dumps(namespace[tests["fn_name"]](*args)))
        except Exception:
            return None
        if got != json.loads(json.dumps(expected)):
            return f"expected {expected!r:.80}, got {got!r:.80}"
    return None

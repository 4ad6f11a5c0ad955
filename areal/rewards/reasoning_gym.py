"""The reasoning-gym reward: the task's own verifier (`dataset.score_answer`) on the answer a completion gives.

A task carries a reference `rg = {name, options, seed, size, index}` (`areal/data/reasoning_gym.py`);
this side rebuilds that dataset once per reference and takes entry `index`, the same entry the
source generated, so the verifier sees the metadata it needs without it crossing the wire.

Which part of a completion is the answer: reasoning-gym's convention is the last
`<answer>...</answer>`. A small model often answers in prose instead ("The answer is 7."), so with
`fallback=True` (the default) a completion without the tags gives its last number when the
reference is a number, else its last non-empty line. `fallback=False` is the strict convention.
The verifier's score is the reward (some tasks give partial credit); a completion with no answer
at all gets 0.0 with reason "no_answer".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_FULL_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:/\d+)?")


@dataclass(frozen=True)
class ReasoningGymResult:
    reward: float
    reason: str | None  # None when fully correct; "no_answer" or "wrong_answer"
    extracted: str | None  # the answer given to the verifier


def extract_rg_answer(completion: str, reference: str, fallback: bool = True) -> str | None:
    """The last <answer> tag's content; else, with `fallback`, the last number (numeric reference) or line."""
    tags = _TAG.findall(completion)
    if tags:
        return tags[-1].strip()
    if not fallback:
        return None
    if _FULL_NUMBER.fullmatch(reference.strip()):
        numbers = _NUMBER.findall(completion)
        return numbers[-1] if numbers else None
    lines = [line.strip() for line in completion.splitlines() if line.strip()]
    return lines[-1].rstrip(".").strip() if lines else None


class ReasoningGymScore:
    """Scores completions of reasoning-gym tasks with each task's own `score_answer`."""

    input_names = ("completion", "rg")

    def __init__(self, fallback: bool = True) -> None:
        self.fallback = fallback
        self._datasets: dict[str, Any] = {}

    def __call__(self, completions: list[str], refs: list[dict[str, Any]]) -> list[ReasoningGymResult]:
        if len(completions) != len(refs):
            raise ValueError(f"reasoning_gym_score: {len(completions)} completions but {len(refs)} task references")
        return [self.score(c, r) for c, r in zip(completions, refs)]

    def score(self, completion: str, ref: dict[str, Any]) -> ReasoningGymResult:
        dataset = self._dataset(ref)
        entry = dataset[int(ref["index"])]
        answer = extract_rg_answer(completion, str(entry["answer"]), self.fallback)
        if answer is None:
            return ReasoningGymResult(0.0, "no_answer", None)
        reward = float(dataset.score_answer(answer, entry))
        return ReasoningGymResult(reward, None if reward >= 1.0 else "wrong_answer", answer)

    def entry(self, ref: dict[str, Any]) -> dict[str, Any]:
        """The reasoning-gym entry a task reference names (question, answer, metadata)."""
        return self._dataset(ref)[int(ref["index"])]

    def _dataset(self, ref: dict[str, Any]) -> Any:
        if not isinstance(ref, dict) or not {"name", "options", "seed", "size", "index"} <= ref.keys():
            raise ValueError(f"reasoning_gym_score: expected a task reference {{name, options, seed, size, index}}, "
                             f"got {ref!r:.120}; use reasoning_gym_tasks() as the source")
        key = json.dumps([ref["name"], ref["options"], ref["seed"], ref["size"]], sort_keys=True)
        if key not in self._datasets:
            import reasoning_gym  # type: ignore[import-untyped]

            self._datasets[key] = reasoning_gym.create_dataset(
                ref["name"], size=int(ref["size"]), seed=int(ref["seed"]), **ref["options"])
        return self._datasets[key]


def reasoning_gym_score(fallback: bool = True) -> ReasoningGymScore:
    """The reasoning-gym reward a recipe plugs in: `reward("score", reasoning_gym_score())`."""
    return ReasoningGymScore(fallback)

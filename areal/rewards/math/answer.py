"""The math reward: find the final answer in a completion, refuse hedges and restated questions, then judge.

Which answer: the last `\\boxed{}` (or `\\fbox{}`), together with the boxes just before it when only
separators stand between them (`\\boxed{2}` and `\\boxed{3}` answer "2, 3"); a last box that never
closes is no answer, never replaced by an earlier box. Without a box, the last "final answer is X",
"answer: X", "answer is X" or "#### X"; else a closing sentence with one number ("Therefore there
are 5 ways."). Refusals (`rules.py`) need no judge; the judge (`verdict.py`: math-verify,
with numbers compared exactly) runs in a child process killed at each answer's time limit
(`judge.py`), so a pathological expression scores 0 with reason "check_timeout" and the run
goes on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from areal.rewards.math.judge import MathJudge, shared_judge
from areal.rewards.math.rules import hedge_between, hedge_in, refusal

# -- finding the answer ---------------------------------------------------------------------

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")
_ANSWER_MARK = re.compile(
    r"final\s+answer\s*(?:is)?\s*[:：]?|\banswer\s*(?:is\b\s*[:：]?|[:：]|(?=\$))|####", re.IGNORECASE
)
# what may stand between boxes that together answer (`$\boxed{2}$ and $x = \boxed{3}$`)
_BOX_SEPARATOR = re.compile(
    r"(?:\s|\$|,|;|\\[()\[\]]|\\quad|\\qquad|\\text\{\s*(?:and|or)\s*\}|\band\b|\bor\b|\b[a-zA-Z]\s*=)*"
)
_CONCLUSION = re.compile(r"\b(?:therefore|thus|hence|so|total|altogether|in all)\b", re.IGNORECASE)
_NUMBER_OR_MATH = re.compile(r"\$[^$]+\$|-?\d+(?:[.,]\d+)*(?:\\?%)?")
_PROSE_WORD = re.compile(r"(?<![\\a-zA-Z])[A-Za-z]{2,}")
_LAST_VERB = re.compile(r"\s(?:is|are|equals|was|were)\s")
MAX_BOXES = 16  # the last boxes read: enough for a listed answer and the box before it
MAX_GAP_CHARS = 40  # between grouped boxes
MAX_HEDGE_GAP_CHARS = 80  # between the answer and an earlier box it is offered as an alternative to


@dataclass(frozen=True)
class Reading:
    answer: str | None  # the final answer as written, or None
    reason: str | None = None  # why it scores 0 without a judge: "no_answer" or "hedged_answer"
    detail: str = ""


def read_completion(text: str) -> Reading:
    """The final answer of a completion, or why there is none (see the module docstring)."""
    boxes = list(_boxes(text))
    if boxes:
        return _boxed_answer(text, boxes)
    for match in reversed(list(_ANSWER_MARK.finditer(text))):
        answer = _stated_value(_clean_tail(text[match.end():].split("\n", 1)[0]))
        if answer:
            return Reading(answer)
    closing = _closing_number(text)
    if closing is not None:
        return Reading(closing)
    return Reading(None, "no_answer", "no \\boxed{}, no 'answer:' line and no closing sentence with one number")


def extract_answer(text: str) -> str | None:
    """The final answer of a completion (`read_completion`), or None."""
    return read_completion(text).answer


def _boxes(text: str) -> list[tuple[int, int, str | None]]:
    """(start, end, content) of the last boxes; content None when its braces never close.

    Only the last MAX_BOXES are read, each in one pass to its closing brace: a completion of
    thousands of unclosed boxes costs this process linear time, not quadratic.
    """
    found = []
    for match in list(_BOXED.finditer(text))[-MAX_BOXES:]:
        content, end = _boxed_content(text, match.end())
        found.append((match.start(), end, content))
    return found


def _boxed_answer(text: str, boxes: list[tuple[int, int, str | None]]) -> Reading:
    start, _, content = boxes[-1]
    if content is None:
        return Reading(None, "no_answer", "the last \\boxed{ never closes (a truncated answer); earlier boxes "
                                          "are not taken in its place")
    if not content.strip():
        return Reading(None, "no_answer", "the last \\boxed{} is empty")
    group, first = [content.strip()], len(boxes) - 1
    while first > 0:
        _, end, previous = boxes[first - 1]
        gap = text[end:boxes[first][0]]
        if previous is None or len(gap) > MAX_GAP_CHARS or not _BOX_SEPARATOR.fullmatch(gap):
            break
        if previous.strip() and previous.strip() not in group:
            group.insert(0, previous.strip())
        first -= 1
    if first > 0:
        gap = text[boxes[first - 1][1]:boxes[first][0]]
        hedge = hedge_between(gap) if len(gap) <= MAX_HEDGE_GAP_CHARS else None
        if hedge:
            detail = f"an earlier box is offered as an alternative ({hedge!r})"
            return Reading(", ".join(group), "hedged_answer", detail)
    return Reading(", ".join(group))


def _boxed_content(text: str, i: int) -> tuple[str | None, int]:
    """(the balanced {...} at text[i] (escaped \\{ \\} do not count), its end), or the token of `\\boxed 5`."""
    if i < len(text) and text[i] != "{":
        token = re.match(r"[^\s$]+", text[i:])
        return (token.group(0), i + token.end()) if token else (None, i)
    depth, j = 0, i
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j], j + 1
        j += 1
    return None, len(text)


def _clean_tail(tail: str) -> str:
    """The answer at the start of a line's tail: a $...$ span, else up to the end of the sentence."""
    tail = tail.strip().strip("*").strip()
    if tail.startswith("$"):
        span = re.match(r"\$+([^$]+)\$", tail)
        if span:
            return span.group(1).strip()
    return re.split(r"\.(?:\s|$)", tail, maxsplit=1)[0].strip().rstrip(".").strip()


def _stated_value(text: str) -> str:
    """The value a sentence states ("The largest $n$ is 34." states 34); a short answer or a hedge as it is."""
    if len(_prose_words(text)) < 2 or hedge_in(text):
        return text
    after = _LAST_VERB.split(text)[-1].strip()
    if not _prose_words(after):
        return after
    values = _NUMBER_OR_MATH.findall(after)
    return values[0].strip("$").strip() if len(values) == 1 else text


def _prose_words(text: str) -> list[str]:
    """Words of two letters or more outside $...$ and LaTeX commands."""
    return _PROSE_WORD.findall(re.sub(r"\$[^$]*\$", " ", text))


def _closing_number(text: str) -> str | None:
    """The one number (or $...$ span) of a finished closing sentence such as "So the total is 20 dollars."."""
    last = text.strip().rsplit("\n", 1)[-1].strip()
    if not last.endswith("."):
        return None
    sentence = re.split(r"(?<=[.!?])\s+", last)[-1]
    values = _NUMBER_OR_MATH.findall(sentence)
    if not _CONCLUSION.search(sentence) or len(values) != 1:
        return None
    return values[0].strip("$").strip()


# -- scoring -----------------------------------------------------------------------------------


def answers_equivalent(predicted: str, reference: str, timeout_s: float = 2.0, prompt: str | None = None) -> bool:
    """Whether a predicted answer means the reference (either may be a whole solution with a box).

    A `prompt` lets restated questions be refused. Checks share one judge process for the whole program.
    """
    answer = _answer_of(predicted)
    if answer is None or refusal(answer, _answer_of(reference) or reference, prompt):
        return False
    return shared_judge().check(_answer_of(reference) or reference, answer, timeout_s).outcome == "equal"


def _answer_of(text: str) -> str | None:
    """The answer a bare answer or a whole solution gives: its final answer if it marks one, else itself."""
    reading = read_completion(text)
    if reading.answer is None and not _BOXED.search(text):
        return _stated_value(text.strip())  # a bare answer, or a sentence that states one
    return reading.answer if reading.reason is None else None


@dataclass(frozen=True)
class MathResult:
    reward: float
    # None if correct; "no_answer", "hedged_answer", "restated_question", "wrong_answer",
    # "check_timeout" (the judge was killed at the time limit) or "check_failed" (the judge broke)
    reason: str | None
    extracted: str | None  # the answer found in the completion
    detail: str = ""  # what the reason refers to, for logs


_REASONS = {"different": "wrong_answer", "timeout": "check_timeout", "failed": "check_failed"}


class MathReward:
    """Scores completions against reference answers: 1.0 when the final answer equals the reference.

    A reference that holds a \\boxed{} or "#### X" (a MATH solution, a GSM8K answer) is reduced to
    that answer first. With `use_prompt`, the reward also reads each task's prompt (an input port
    `prompt`) and refuses answers that restate it. Judgements run one at a time in this reward's
    own child process, each within `timeout_s`.
    """

    def __init__(self, timeout_s: float = 2.0, use_prompt: bool = False) -> None:
        if not timeout_s > 0:
            raise ValueError(f"math_reward: timeout_s must be > 0, got {timeout_s!r}")
        self.timeout_s = timeout_s
        self.input_names = ("completion", "answer", "prompt") if use_prompt else ("completion", "answer")
        self.judge = MathJudge()

    def __call__(
        self, completions: list[str], answers: list[str], prompts: list[str] | None = None
    ) -> list[MathResult]:
        if len(completions) != len(answers) or (prompts is not None and len(prompts) != len(answers)):
            counts = f"{len(completions)} completions but {len(answers)} answers"
            raise ValueError(f"math_reward: {counts}" + (f" and {len(prompts)} prompts" if prompts is not None else ""))
        return [self.score(c, a, p) for c, a, p in zip(completions, answers, prompts or [None] * len(answers))]

    def score(self, completion: str, answer: str | int | float, prompt: str | None = None) -> MathResult:
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)  # a task built in Python: {"answer": 42}
        elif not isinstance(answer, str):  # the task's fault, not the completion's: failed, never a 0
            return MathResult(0.0, "check_failed", None, f"the reference answer is {type(answer).__name__} "
                                                         f"{answer!r:.60}, not text or a number")
        reading = read_completion(completion)
        if reading.answer is None or reading.reason is not None:
            return MathResult(0.0, reading.reason, reading.answer, reading.detail)
        reference = extract_answer(answer) or answer
        refused = refusal(reading.answer, reference, prompt)
        if refused:
            return MathResult(0.0, refused[0], reading.answer, refused[1])
        verdict = self.judge.check(reference, reading.answer, self.timeout_s)
        if verdict.outcome == "equal":
            return MathResult(1.0, None, reading.answer)
        return MathResult(0.0, _REASONS[verdict.outcome], reading.answer, verdict.detail)

    def close(self) -> None:
        self.judge.close()

    def __enter__(self) -> MathReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def math_reward(timeout_s: float = 2.0, use_prompt: bool = False) -> MathReward:
    """The math reward a recipe plugs in: `reward("score", math_reward(timeout_s=2.0, use_prompt=True))`."""
    return MathReward(timeout_s, use_prompt)

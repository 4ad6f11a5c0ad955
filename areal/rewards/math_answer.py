"""The math reward: pull the final answer out of a completion and decide if it equals the reference.

Cheap checks run here: the normalised strings are equal, or both are numbers (integers, decimals,
fractions, percentages, scientific notation) with equal values. Anything else (\\sqrt, \\pi,
algebra, intervals) goes to the sympy check of `math_symbolic`, which runs in a child process
under a timeout. Number parsing here bounds exponents, so nothing in this process can hang.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from areal.rewards.math_symbolic import REL_TOL, SymbolicChecker, shared_checker

MAX_EXPONENT = 400  # 1e400 is still exact; 1e1000000000 would hang Fraction before any timeout could help

# -- extraction -----------------------------------------------------------------------------

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")
_ANSWER_MARK = re.compile(r"final\s+answer\s*(?:is)?\s*[:：]?|\banswer\s*[:：]|####", re.IGNORECASE)


def extract_answer(text: str) -> str | None:
    """The last \\boxed{...} or \\fbox{...}; else the last "final answer is X", "Answer: X" or "#### X"."""
    for match in reversed(list(_BOXED.finditer(text))):
        content = _boxed_content(text, match.end())
        if content is not None and content.strip():
            return content.strip()
    for match in reversed(list(_ANSWER_MARK.finditer(text))):
        answer = _clean_tail(text[match.end():].split("\n", 1)[0])
        if answer:
            return answer
    return None


def _boxed_content(text: str, i: int) -> str | None:
    """The balanced {...} at text[i] (escaped \\{ \\} do not count), or the one token of `\\boxed 5`."""
    if i < len(text) and text[i] != "{":
        token = re.match(r"[^\s$]+", text[i:])
        return token.group(0) if token else None
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
                return text[i + 1 : j]
        j += 1
    return None


def _clean_tail(tail: str) -> str:
    """The answer at the start of a line's tail: a $...$ span, else up to the end of the sentence."""
    tail = tail.strip().strip("*").strip()
    if tail.startswith("$"):
        span = re.match(r"\$+([^$]+)\$", tail)
        if span:
            return span.group(1).strip()
    return re.split(r"\.(?:\s|$)", tail, maxsplit=1)[0].strip().rstrip(".").strip()


# -- normalisation and numbers --------------------------------------------------------------

_UNIT = re.compile(r"(?<=\S)\s*\\(?:text|mbox|mathrm)\{[^{}]*\}(?:\^\{?\d\}?)?\s*$")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")


def normalise(answer: str) -> str:
    """A canonical string: no $, \\left/\\right, spacing commands, units, trailing period or spaces."""
    s = answer.strip()
    whole_box = re.fullmatch(r"\\(?:boxed|fbox)\s*(\{.*\})", s, re.DOTALL)
    if whole_box and _boxed_content(whole_box.group(1), 0) == whole_box.group(1)[1:-1]:
        s = whole_box.group(1)[1:-1]
    s = s.replace("$", "").replace("\\%", "%").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\[!,;:]", "", s).replace("\\ ", " ").replace("~", " ")
    s = re.sub(r"\\(?:left|right)(?![a-zA-Z])", "", s)
    s = re.sub(r"\^\s*\{?\\circ\}?|°", "", s)
    s = _UNIT.sub("", s)
    s = _TEXT.sub(r"\1", s)
    s = s.strip().rstrip(".").strip()
    s = s.replace("{,}", ",")
    if re.fullmatch(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    assignment = re.fullmatch(r"[a-zA-Z]\s*=\s*([^=]+)", s)
    if assignment:
        s = assignment.group(1)
    choice = re.fullmatch(r"\(([A-Za-z])\)", s)
    if choice:
        s = choice.group(1)
    # keep one space only where it separates a command from a letter (\pi r); drop the rest
    s = re.sub(r"(\\[a-zA-Z]+)\s+(?=[a-zA-Z0-9])", r"\1 ", s)
    return re.sub(r"(?<![a-zA-Z])\s+|\s+(?![a-zA-Z0-9])", "", s)


_PLAIN = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def _plain(s: str) -> Fraction | None:
    if len(s) > 200 or not _PLAIN.fullmatch(s):
        return None
    exponent = re.search(r"[eE]([+-]?\d+)$", s)
    if exponent and abs(int(exponent.group(1))) > MAX_EXPONENT:
        return None
    return Fraction(s)


def number(s: str) -> tuple[Fraction, bool] | None:
    """(value, is_percentage) of a normalised numeric answer, else None; exact for every form it takes."""
    percent = s.endswith("%")
    s = s[:-1] if percent else s
    frac = re.fullmatch(r"([+-]?)\\frac(?:\{([^{}]+)\}\{([^{}]+)\}|(\d)(\d))", s)
    ratio = re.fullmatch(r"([+-]?[\d.]+)/([+-]?[\d.]+)", s)
    times = re.fullmatch(r"([+-]?[\d.]+)(?:\\times|\\cdot|\*)10\^\{?([+-]?\d+)\}?", s)
    value: Fraction | None
    if frac:
        num, den = _plain(frac.group(2) or frac.group(4)), _plain(frac.group(3) or frac.group(5))
        value = None if num is None or not den else (-num if frac.group(1) == "-" else num) / den
    elif ratio:
        num, den = _plain(ratio.group(1)), _plain(ratio.group(2))
        value = None if num is None or not den else num / den
    elif times:
        mantissa, exponent = _plain(times.group(1)), int(times.group(2))
        value = None if mantissa is None or abs(exponent) > MAX_EXPONENT else mantissa * Fraction(10) ** exponent
    else:
        value = _plain(s)
    return None if value is None else (value, percent)


def _numbers_equal(a: tuple[Fraction, bool], b: tuple[Fraction, bool]) -> bool:
    """Equal values; a percentage p% also matches p/100 (and p), whichever side wrote the %."""
    left = {a[0], a[0] / 100} if a[1] else {a[0]}
    right = {b[0], b[0] / 100} if b[1] else {b[0]}
    return any(x == y or abs(x - y) <= REL_TOL * max(abs(x), abs(y)) for x in left for y in right)


# -- comparison -----------------------------------------------------------------------------


def _compare(predicted: str, reference: str, timeout_s: float, checker: SymbolicChecker) -> str:
    """"equal", "different", "timeout" or "failed" (the symbolic checker died)."""
    p, r = normalise(predicted), normalise(reference)
    if not p or not r:
        return "different"
    if p == r:
        return "equal"
    p_num, r_num = number(p), number(r)
    if p_num is not None and r_num is not None:
        return "equal" if _numbers_equal(p_num, r_num) else "different"
    return checker.check(p, r, timeout_s)


def answers_equivalent(predicted: str, reference: str, timeout_s: float = 2.0) -> bool:
    """Whether two answers mean the same: strings, then numbers, then sympy within `timeout_s`."""
    return _compare(predicted, reference, timeout_s, shared_checker()) == "equal"


@dataclass(frozen=True)
class MathResult:
    reward: float
    reason: str | None  # None if correct; "no_answer", "wrong_answer", "check_timeout" or "check_failed"
    extracted: str | None  # the answer pulled from the completion


_REASONS = {"different": "wrong_answer", "timeout": "check_timeout", "failed": "check_failed"}


class MathReward:
    """Scores completions against reference answers: 1.0 when the extracted answer is equivalent.

    A reference that holds a \\boxed{} or "#### X" (a MATH solution, a GSM8K answer) is reduced to
    that answer first. Symbolic checks run one at a time in this reward's own child process.
    """

    input_names = ("completion", "answer")

    def __init__(self, timeout_s: float = 2.0) -> None:
        if not timeout_s > 0:
            raise ValueError(f"math_reward: timeout_s must be > 0, got {timeout_s!r}")
        self.timeout_s = timeout_s
        self.checker = SymbolicChecker()

    def __call__(self, completions: list[str], answers: list[str]) -> list[MathResult]:
        if len(completions) != len(answers):
            raise ValueError(f"math_reward: {len(completions)} completions but {len(answers)} answers")
        return [self.score(c, a) for c, a in zip(completions, answers)]

    def score(self, completion: str, answer: str) -> MathResult:
        extracted = extract_answer(completion)
        if extracted is None:
            return MathResult(0.0, "no_answer", None)
        reference = extract_answer(answer) or answer
        verdict = _compare(extracted, reference, self.timeout_s, self.checker)
        return MathResult(1.0 if verdict == "equal" else 0.0, _REASONS.get(verdict), extracted)

    def close(self) -> None:
        self.checker.close()

    def __enter__(self) -> MathReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def math_reward(timeout_s: float = 2.0) -> MathReward:
    """The math reward a recipe plugs in: `reward("score", math_reward(timeout_s=2.0))`."""
    return MathReward(timeout_s)

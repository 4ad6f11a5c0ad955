"""Answers the math reward refuses whatever their value: hedged, unevaluated, restated or in the wrong form.

math-verify reads a trailing `\\text{...}` as a unit and drops it, so `5 \\text{ (or possibly 6)}`
scores as 5; and it compares values, so `17 \\times 23` scores as 391 on "What is 17 x 23?". A
policy optimised against the reward finds both. These rules read the answer's words and, when
the reward is given it, the task's prompt; they never look at values (`verdict.py` does).

- **Hedged**: a word that qualifies the answer (possibly, approximately, maybe, not, at least, if,
  ...) unless the reference uses it too, `?`, or an answer that starts with `\\approx` (after an
  exact value, `\\approx 0.333` is a gloss and the value is judged); and "or"/"either" when the
  reference is one value (several values may be joined by "or").
- **Unevaluated**: integers or decimals joined by + - x . / only (`17 \\times 23`) for a reference
  that is a plain number, with or without the prompt. Powers, roots, factorials and fractions are
  closed forms and are judged (`2^{10}` for 1024, unless the prompt asks to compute `2^{10}`).
- **Restated question** (prompt given): an answer written with the prompt's own numbers and
  operators (`23 \\times 17`, `12/3`, `\\frac{6}{8}`) when the reference is a plain number, or an
  expression that appears verbatim in the prompt (`x^2 + 5x + 6` on "Factor $x^2 + 5x + 6$").
  An answer written exactly as the reference is never refused.
- **Wrong form** (prompt given): a decimal where the prompt asks for a (common) fraction or lowest
  terms, a fraction not in lowest terms there, or a fraction where it asks for a decimal.

Not caught: a restatement rewritten into other numbers (`\\frac{10!}{3!\\,7!}` on "Compute `\\binom{10}{3}`").
"""

from __future__ import annotations

import re
from collections import Counter
from fractions import Fraction

HEDGES = frozenset(
    "possibly perhaps maybe probably likely approximately approx roughly about around nearly almost "
    "guess unsure not but unless if assuming assume estimate estimated least most".split()
)
ALTERNATIVES = frozenset({"or", "either"})
# between two boxes "but that was wrong" is a correction, not a hedge; only offered alternatives count
GAP_HEDGES = ALTERNATIVES | {"possibly", "perhaps", "maybe", "probably", "alternatively"}

_WORD = re.compile(r"(?<![\\a-zA-Z])[A-Za-z]+")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_PLAIN_NUMBER = re.compile(r"-?(?:\d+(?:\.\d+)?|\.\d+)(?:\\?%)?")
_FRACTION = re.compile(r"-?(?:\\frac\{(\d+)\}\{(\d+)\}|(\d+)/(\d+))")
_MATH_SPAN = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_APPROXIMATION = re.compile(r"\\approx|≈")
# integers and decimals joined by + - * x . / only: `17 \\times 23` for 391 (not powers, roots or fractions)
_ARITHMETIC = re.compile(r"\(?-?\d+(?:\.\d+)?\)?(?:\s?(?:\+|-|\*|\\times|\\cdot|\\div|×|·)\s?\(?-?\d+(?:\.\d+)?\)?)+")
_DECIMAL = re.compile(r"\d?\.\d")
_ASKS_FRACTION = re.compile(
    r"\b(?:common|improper|simplified|reduced)\s+fraction|\bas\s+a\s+fraction|simplest\s+form|lowest\s+terms", re.I
)
_ASKS_DECIMAL = re.compile(
    r"\bas\s+a\s+decimal|\bdecimal\s+form|\bto\s+the\s+nearest\s+(?:tenth|hundredth|thousandth)", re.I
)
_COMMANDS = ("\\left", "\\right", "\\displaystyle", "\\!", "\\,", "\\;", "\\ ")


def refusal(answer: str, reference: str, prompt: str | None = None) -> tuple[str, str] | None:
    """(reason, detail) when `answer` must score 0 whatever its value; None when the judge should decide."""
    hedge = hedge_in(answer, reference)
    if hedge:
        return "hedged_answer", f"the answer hedges ({hedge!r})"
    exact = _APPROXIMATION.split(answer, maxsplit=1)[0]  # `\\frac{1}{3} \\approx 0.333` answers 1/3
    if _is_number_literal(_canonical(reference)) and _ARITHMETIC.fullmatch(_canonical(exact)):
        return "unevaluated_answer", f"the answer {exact.strip()!r} is arithmetic left undone"
    if prompt and _canonical(exact) != _canonical(reference):
        restated = restatement(exact, reference, prompt)
        if restated:
            return "restated_question", restated
        form = wrong_form(exact, reference, prompt)
        if form:
            return "wrong_form", form
    return None


def wrong_form(answer: str, reference: str, prompt: str) -> str | None:
    """Why `answer` is not in the form the prompt asks for ("as a common fraction", "as a decimal"), else None."""
    a, r = _canonical(answer), _canonical(reference)
    if _ASKS_FRACTION.search(prompt) and not _DECIMAL.search(r):
        if _DECIMAL.search(a):
            return f"the prompt asks for a fraction; {answer.strip()!r} is a decimal"
        if _FRACTION.fullmatch(a) and not _is_reduced_fraction(a):
            return f"the prompt asks for a fraction in lowest terms; {answer.strip()!r} is not"
    if _ASKS_DECIMAL.search(prompt) and not _FRACTION.search(r) and _FRACTION.search(a):
        return f"the prompt asks for a decimal; {answer.strip()!r} is a fraction"
    return None


def hedge_in(answer: str, reference: str = "") -> str | None:
    """The first hedge in `answer` (a word, `\\approx` or `?`) that the reference does not itself use, else None."""
    own = {w.lower() for w in _WORD.findall(reference)}
    several = _several_values(reference)
    for word in _WORD.findall(answer):
        lowered = word.lower()
        if lowered not in own and (lowered in HEDGES or (lowered in ALTERNATIVES and not several)):
            return word
    if "?" in answer and "?" not in reference:
        return "?"
    starts = _APPROXIMATION.match(answer.strip().strip("$").strip())
    return starts.group(0) if starts else None  # an approximation alone; after an exact value it is a gloss


def hedge_between(gap: str) -> str | None:
    """An alternative offered in the text between two boxed answers (`\\boxed{3} or possibly \\boxed{4}`), else None."""
    return next((w for w in _WORD.findall(gap) if w.lower() in GAP_HEDGES), None)


def _several_values(reference: str) -> bool:
    """A reference of several values (`2, 3`, `\\pm 1`, `2 or 3`), where "or" separates values, not guesses."""
    return ("," in reference and not re.search(r"\d,\d{3}", reference)) or "\\pm" in reference or bool(
        re.search(r"\bor\b", reference)
    )


def restatement(answer: str, reference: str, prompt: str) -> str | None:
    """Why `answer` restates `prompt` rather than answering it, else None."""
    a = _canonical(answer)
    if _PLAIN_NUMBER.fullmatch(a) or _is_reduced_fraction(a):
        return None  # a value, however it is written, is an answer
    if _is_number_literal(_canonical(reference)) and not _has_variable(a):
        numbers, given = Counter(_NUMBER.findall(a)), Counter(_NUMBER.findall(prompt))
        if numbers and numbers <= given:
            return f"the answer {answer.strip()!r} is the question's own arithmetic, not its value"
    for span in _prompt_math(prompt):
        at = span.find(a)
        while at >= 0:
            before, after = span[at - 1 : at], span[at + len(a) : at + len(a) + 1]
            if not (before.isalnum() or after.isalnum()):
                return f"the answer {answer.strip()!r} is copied from the question"
            at = span.find(a, at + 1)
    return None


def _canonical(s: str) -> str:
    """Spacing and sizing commands, `$` and `\\dfrac` gone; whitespace kept only between two words or numbers."""
    s = s.strip().strip("$")
    for command in _COMMANDS:
        s = s.replace(command, " ")
    s = re.sub(r"\\[dt]frac", r"\\frac", s).replace("$", "")
    s = re.sub(r"(?<=[A-Za-z0-9])\s+(?=[A-Za-z0-9])", "\x00", s)
    return re.sub(r"\s+", "", s).replace("\x00", " ").rstrip(".")


def _prompt_math(prompt: str) -> list[str]:
    """The prompt's math spans, canonical; the whole prompt where it writes math without `$`."""
    spans = [next(g for g in m.groups() if g is not None) for m in _MATH_SPAN.finditer(prompt)]
    return [_canonical(s) for s in spans] if spans else [_canonical(prompt)]


def _is_number_literal(s: str) -> bool:
    return bool(_PLAIN_NUMBER.fullmatch(s) or _FRACTION.fullmatch(s))


def _is_reduced_fraction(s: str) -> bool:
    m = _FRACTION.fullmatch(s)
    if not m:
        return False
    num, den = (int(g) for g in (m.group(1) or m.group(3), m.group(2) or m.group(4)))
    return den > 1 and Fraction(num, den).denominator == den


def _has_variable(s: str) -> bool:
    return bool(_WORD.search(s))  # a letter outside a command: a variable or a word

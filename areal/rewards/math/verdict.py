"""Whether an answer equals a reference: math-verify reads and compares, areal decides numbers exactly.

The one idea: math-verify (Hugging Face's checker, the one AReaL and TRL use) is good at reading
LaTeX and comparing structures (sets, intervals, matrices, relations, named tuples), but it
compares numbers by rounding to 6 places or chopping below 1e-15, so `\\frac{1}{2^{99}}` equals
`\\frac{1}{2^{98}}`, `0.333333` equals `\\frac{1}{3}` and `3.141593` equals `\\pi`. Here, wherever
both sides are numbers (alone, or the entries of a tuple, set, interval or matrix that math-verify
matched), areal compares them exactly instead: a decimal is the exact value it writes, and two
values are equal only when their difference is zero to 30 significant digits of their size.

This file runs inside the judge's child process (`judge.py` starts it as a script), so it
imports only the standard library, sympy and math-verify, never areal or torch. math-verify's
own timeouts use `signal.alarm`; they are off here: the parent kills this process instead.
Refusals that read the answer's words or the prompt (hedges, restated questions) are not here:
they run in the parent (`rules.py`).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from fractions import Fraction
from typing import Any

MEMORY_BYTES = 2 << 30  # address-space limit of the child: a huge power fails here instead of swapping
RELATIVE_DIGITS = 30  # two exact values this close relative to their size are the same value

# -- reading an answer before math-verify ------------------------------------------------------

_GROUP_SEP = r"(?:,\\!\s*|\s*\{\s*,\s*\}\s*|,|\\,|\\!|\\ )"
_THOUSANDS = re.compile(rf"(?<![\d.,])(\d{{1,3}})((?:{_GROUP_SEP}\d{{3}})+)(?![\d])")
_SPACED_THOUSANDS = re.compile(r"-?\d{1,3}(?: \d{3})+(?:\.\d+)?")
_REPEATING = re.compile(r"(-?)(\d*)\.(\d*)\\overline\{(\d+)\}")
# a whole number then a fraction, standing alone (not `2 \\cdot 3\\frac{1}{2}`): `2\\frac{1}{2}`, `(-1\\frac{3}{4}, 0)`
_MIXED = re.compile(r"(?:^|(?<=[(\[{,=$])|(?<=[(\[{,=$] ))(-?)(\d+)\s*\\[dt]?frac\{(\d+)\}\{(\d+)\}"
                    r"(?=\s*(?:$|[)\]},$%]|\\%|\\text|\\mbox))")
_DECIMAL_LITERAL = re.compile(r"-?(\d*)\.(\d+)")
_SPACED_MIXED = re.compile(r"(-?)(\d+) (\d+)/(\d+)")
_SCIENTIFIC = re.compile(r"(-?\d+(?:\.\d+)?)[eE]([+-]?\d+)")
_UNICODE = {"π": "\\pi ", "√": "\\sqrt", "×": "\\times ", "·": "\\cdot ", "÷": "\\div ", "−": "-", "≤": "\\le ",
            "≥": "\\ge ", "≠": "\\neq ", "∞": "\\infty ", "°": "^\\circ"}
_WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
          "sixteen seventeen eighteen nineteen twenty").split()
_NUMBER_THEN_WORDS = re.compile(r"(-?\d[\d.]*(?:\\?%)?)\s+([A-Za-z][A-Za-z ]*)")
_NUMBER_WORD = re.compile(r"(?:\\text\{)?\s*([A-Za-z]+)\s*\}?")


def read_answer(answer: str) -> str:
    """The answer as math-verify should read it: separators, repeating decimals, mixed numbers and
    number words written out as plain LaTeX numbers."""
    s = answer.strip().rstrip(".").strip().strip("$").strip()
    for char, latex in _UNICODE.items():
        s = s.replace(char, latex)
    s = re.sub(r"\\sqrt(\d+)", r"\\sqrt{\1}", s)
    s = s.replace("\\varnothing", "\\emptyset").replace("\\{\\}", "\\emptyset")
    spaced_mixed = _SPACED_MIXED.fullmatch(s)  # `1 1/2`, the plain-text mixed number
    if spaced_mixed:
        sign, whole, num, den = spaced_mixed.groups()
        s = f"{sign}{whole}\\frac{{{num}}}{{{den}}}"
    scientific = _SCIENTIFIC.fullmatch(s)
    if scientific:  # 1.5e3, not Euler's number: math-verify reads it as 1.5 * e * 3
        s = f"{scientific.group(1)} \\times 10^{{{scientific.group(2)}}}"
    if _SPACED_THOUSANDS.fullmatch(s):
        s = s.replace(" ", "")
    s = _THOUSANDS.sub(lambda m: m.group(1) + re.sub(r"\D", "", m.group(2)), s)
    s = _REPEATING.sub(_repeating_fraction, s)
    s = _MIXED.sub(_mixed_fraction, s)
    worded = _NUMBER_THEN_WORDS.fullmatch(s)  # `10 dollars`, `12 apples each`: a number and its unit in words
    if worded and not {"or", "and"} & set(worded.group(2).lower().split()):
        s = worded.group(1)
    word = _NUMBER_WORD.fullmatch(s)
    if word and word.group(1).lower() in _WORDS:
        s = str(_WORDS.index(word.group(1).lower()))
    return s


def _repeating_fraction(m: re.Match[str]) -> str:
    """`0.1\\overline{6}` is 1/6 exactly: the written digits plus the repeating tail as a geometric series."""
    sign, whole, fixed, repeat = m.groups()
    value = Fraction(int(whole or 0)) + Fraction(int(fixed or 0), 10 ** len(fixed))
    value += Fraction(int(repeat), (10 ** len(repeat) - 1) * 10 ** len(fixed))
    return f"{sign}\\frac{{{value.numerator}}}{{{value.denominator}}}"


def _mixed_fraction(m: re.Match[str]) -> str:
    """`2\\frac{1}{2}` is the mixed number 5/2 when the fraction is proper; otherwise a product, left alone."""
    sign, whole, num, den = m.groups()
    if int(den) == 0 or int(num) >= int(den):
        return m.group(0)
    value = int(whole) * int(den) + int(num)
    return f"{sign}\\frac{{{value}}}{{{den}}}"


def parse_answer(answer: str) -> list[Any]:
    """math-verify's reading of one answer (a sympy object, then its string), timeouts off."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    text = "\\boxed{" + read_answer(answer) + "}"
    return parse(text, extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()], parsing_timeout=None)


# -- comparing ---------------------------------------------------------------------------------


def answers_match(reference: str, answer: str) -> bool:
    """Whether `answer` equals `reference` (gold first: math-verify is not symmetric)."""
    if re.sub(r"\s+", "", read_answer(reference)) == re.sub(r"\s+", "", read_answer(answer)):
        return True  # written alike: `12:00` is the same time even though math-verify reads it as 12/0
    gold, pred = parse_answer(reference), parse_answer(answer)
    if not gold or not pred:
        return False
    return _match(gold, pred, _computed_places(read_answer(reference)))


def _match(gold: list[Any], pred: list[Any], computed_places: int | None = None) -> bool:
    import sympy
    from math_verify import verify

    g, p = gold[0], pred[0]
    if isinstance(g, sympy.Basic) and isinstance(p, sympy.Basic):
        g, p = _unwrap_assignments(g, p)
        if _is_number(g) and _is_number(p):
            if computed_places is not None and not p.atoms(sympy.Float):
                return _within(g, p, sympy.Rational(1, 10**computed_places))
            return same_number(g, p)
    allow_relation = _is_set(g) and _is_simple_relation(p)
    if not verify(gold, pred, timeout_seconds=None, allow_set_relation_comp=allow_relation):
        return False
    return _numbers_agree(g, p)


def _unwrap_assignments(g: Any, p: Any) -> tuple[Any, Any]:
    """`x = 3` against `3` compares 3 with 3; `k = 4` against `k = 4.0` compares the right sides.

    Two assignments to different variables (`y = 2`, `x = 2`) stay as they are: math-verify keeps them apart.
    """
    from math_verify.grader import is_assignment_relation, is_equation, take_last_relation

    if is_assignment_relation(g) and is_assignment_relation(p):
        if take_last_relation(g).lhs == take_last_relation(p).lhs:
            return take_last_relation(g).rhs, take_last_relation(p).rhs
        return g, p
    if is_assignment_relation(g) and not is_equation(p):
        return take_last_relation(g).rhs, p
    if is_assignment_relation(p) and not is_equation(g):
        return g, take_last_relation(p).rhs
    return g, p


def _is_number(e: Any) -> bool:
    import sympy

    return (isinstance(e, sympy.Expr) and not isinstance(e, (sympy.MatrixBase, sympy.MatrixExpr))
            and e.is_number and not e.free_symbols)


def _is_set(e: Any) -> bool:
    import sympy

    return isinstance(e, sympy.Set) and not isinstance(e, sympy.FiniteSet)


def _is_simple_relation(e: Any) -> bool:
    """`x < 3` or `-2 \\le x \\le 2`: one variable against numbers; such an answer may be read as an interval.

    Anything else (a restated inequality from the question) is not: math-verify's reason for
    refusing relation-vs-interval comparisons by default.
    """
    import sympy
    from sympy.core.relational import Relational

    parts = list(getattr(e, "_unsorted_args", e.args)) if isinstance(e, sympy.And) else [e]
    if not parts or not all(isinstance(r, Relational) and not isinstance(r, sympy.Eq) for r in parts):
        return False
    if len(e.free_symbols) != 1:
        return False
    return all(side.is_Symbol or _is_number(side) for r in parts for side in (r.lhs, r.rhs))


# -- numbers, exactly --------------------------------------------------------------------------


def same_number(gold: Any, pred: Any) -> bool:
    """Exact equality of two numbers. A percentage p% also matches the plain number p (either side) when
    |p| > 1: `25\\%` answers "what percent" as 25 does, but `0.25\\%` is not the proportion 0.25."""
    gold_value, gold_written = _percent(gold)
    pred_value, pred_written = _percent(pred)
    if _exactly_equal(gold_value, pred_value):
        return True
    if (gold_written is None) == (pred_written is None):
        return False
    written, plain = (gold_written, pred_value) if gold_written is not None else (pred_written, gold_value)
    return bool(abs(written.doit()) > 1) and _exactly_equal(written, plain)


def _computed_places(reference: str) -> int | None:
    """The decimal places of a reference printed from a computed float (six significant digits or more), else None.

    `0.33` is a rounded answer and `0.000001` a tiny value: both are compared exactly, not to their last place.
    """
    decimal = _DECIMAL_LITERAL.fullmatch(reference)
    if not decimal or len((decimal.group(1) + decimal.group(2)).lstrip("0")) < 6:
        return None
    return len(decimal.group(2))


def _within(gold: Any, pred: Any, unit: Any) -> bool:
    """An exact answer against a reference printed from a float (`0.6666666666666666` for 2/3): equal to its last
    printed place, since the shortest round-tripping print of a float is not always correctly rounded."""
    import sympy

    try:
        return bool(sympy.Abs(_exact(gold) - _exact(pred)).evalf(RELATIVE_DIGITS + 20) <= unit)
    except (ArithmeticError, TypeError, ValueError, RecursionError):
        return False


def _percent(e: Any) -> tuple[Any, Any]:
    """(value, the number written before %) of math-verify's `p * UnevaluatedExpr(1/100)`; (e, None) otherwise."""
    import sympy

    hundredth = sympy.UnevaluatedExpr(sympy.Rational(1, 100))
    if isinstance(e, sympy.Mul) and hundredth in e.args:
        rest = [a for a in e.args if a != hundredth]
        written = sympy.Mul(*rest)
        return written / 100, written
    return e, None


def _exact(e: Any) -> Any:
    """The value as written: unevaluated parts evaluated, each decimal the rational number it spells."""
    import sympy

    e = e.doit()
    return e.xreplace({f: sympy.Rational(str(f)) for f in e.atoms(sympy.Float)})


def _exactly_equal(a: Any, b: Any) -> bool:
    import sympy

    try:
        a, b = _exact(a), _exact(b)
        if a.has(sympy.zoo, sympy.nan) or b.has(sympy.zoo, sympy.nan):
            return False  # a division by zero (`12:00` read as 12/0) equals nothing, itself included
        if a == b:
            return True
        if a.has(sympy.oo, -sympy.oo) or b.has(sympy.oo, -sympy.oo) or (a.is_Rational and b.is_Rational):
            return False
        size = max(sympy.Abs(a).evalf(RELATIVE_DIGITS + 20), sympy.Abs(b).evalf(RELATIVE_DIGITS + 20))
        gap = sympy.Abs(a - b).evalf(RELATIVE_DIGITS + 20)
        return bool(gap <= size * sympy.Float(10) ** -RELATIVE_DIGITS)
    except (ArithmeticError, TypeError, ValueError, RecursionError):
        return False  # sympy could not evaluate it: not shown equal


def _numbers_agree(g: Any, p: Any) -> bool:
    """After math-verify matched two structures: every pair of numbers inside them is also exactly equal."""
    import sympy

    g, p = _unwrap_assignments(g, p) if isinstance(g, sympy.Basic) and isinstance(p, sympy.Basic) else (g, p)
    if _is_number(g) and _is_number(p):
        return same_number(g, p)
    if _is_expression(g) and _is_expression(p):
        return _same_function(g, p)
    if isinstance(g, sympy.MatrixBase) and isinstance(p, sympy.MatrixBase):
        return g.shape != p.shape or all(_numbers_agree(a, b) for a, b in zip(g, p))
    if isinstance(g, sympy.Interval) and isinstance(p, sympy.Interval):
        return _numbers_agree(g.start, p.start) and _numbers_agree(g.end, p.end)
    if isinstance(g, sympy.Tuple) and isinstance(p, sympy.Tuple) and len(g) == len(p):
        return all(_numbers_agree(a, b) for a, b in zip(g, p))
    if isinstance(g, sympy.FiniteSet) and isinstance(p, sympy.FiniteSet) and len(g) == len(p):
        if all(_is_number(x) for x in (*g.args, *p.args)):
            by_value = [sorted(s.args, key=lambda x: sympy.re(x.evalf(RELATIVE_DIGITS))) for s in (g, p)]
            return all(same_number(a, b) for a, b in zip(*by_value))
    return True  # nothing numeric to re-check: math-verify's structural verdict stands


PROBES = ((7, 11), (13, 17), (19, 23))  # rational points, away from 0, 1 and the usual poles


def _is_expression(e: Any) -> bool:
    import sympy

    return isinstance(e, sympy.Expr) and not isinstance(e, (sympy.MatrixBase, sympy.MatrixExpr)) and bool(
        e.free_symbols
    )


def _same_function(g: Any, p: Any) -> bool:
    """Two expressions math-verify called equal also agree exactly at a few points: math-verify's numeric test
    chops differences below 1e-15, so `x^2 + 10^{-20}` passed for `x^2`."""
    import sympy

    if g.free_symbols != p.free_symbols:
        return True  # matched by name (`\\text{Monday}` and the letters M o n d a y): no values to probe
    if any(e.has(sympy.Sum, sympy.Product, sympy.Integral, sympy.Limit, sympy.Derivative) for e in (g, p)):
        return True  # evaluating a symbolic sum or integral at a point can take longer than the check may
    symbols = sorted(g.free_symbols, key=str)
    g, p = _exact(g), _exact(p)
    for k in range(len(PROBES)):
        point = {x: sympy.Rational(*PROBES[(k + i) % len(PROBES)]) for i, x in enumerate(symbols)}
        a, b = g.xreplace(point), p.xreplace(point)
        if _is_number(a) and _is_number(b) and not (a.has(sympy.zoo, sympy.nan) or b.has(sympy.zoo, sympy.nan)):
            if not _exactly_equal(a, b):
                return False
    return True


# -- the child process -------------------------------------------------------------------------


def serve() -> None:
    """One JSON request per line in ({reference, answer}), one verdict per line out."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    logging.disable(logging.WARNING)  # math-verify warns that its timeouts are off: they are, on purpose
    parse_answer("1")  # load math-verify's grammar before "ready": no check pays for it
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        reply: dict[str, str]
        try:
            equal = answers_match(request["reference"], request["answer"])
            reply = {"verdict": "equal" if equal else "different"}
        except (MemoryError, RecursionError, ArithmeticError, ValueError) as exc:
            # the answer's doing (past the memory limit, nested too deep, a 5000-digit numeral): not shown equal
            reply = {"verdict": "different", "error": f"{type(exc).__name__}: {exc}"[:300]}
        except Exception as exc:  # a judge bug: reported as check_failed, never as a silent wrong answer
            reply = {"verdict": "failed", "error": f"{type(exc).__name__}: {exc}"[:300]}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    serve()

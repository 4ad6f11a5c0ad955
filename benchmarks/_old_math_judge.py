"""The math checker areal used before issue #35, kept verbatim for `bench_math_judge.py` only.

It was `areal/rewards/math_answer.py` (extraction, string and number checks) and
`areal/rewards/math_symbolic.py` (its own LaTeX parser into sympy, run in a child process),
joined into one file. The child runs this file as a script, so it imports only the standard
library and sympy. Nothing in areal imports it; it is the benchmark's baseline.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 60.0  # python + sympy import on a loaded 2-core machine; not part of a check's budget
MEMORY_BYTES = 2 << 30  # address-space limit of the child
REL_TOL = 1e-6

# -- the parent side ------------------------------------------------------------------------


class SymbolicChecker:
    """A child process running `_serve`; one check at a time, killed by pid on a timeout, restarted lazily."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._pending = b""
        self._lock = threading.Lock()

    def check(self, a: str, b: str, timeout_s: float) -> str:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            proc = self._proc
            assert proc is not None and proc.stdin is not None
            try:
                proc.stdin.write(json.dumps({"a": a, "b": b}).encode() + b"\n")
                proc.stdin.flush()
            except BrokenPipeError:
                self._stop()
                return "failed"
            line = self._read_line(time.monotonic() + timeout_s)
            if line is None:
                self._stop()
                return "timeout"
            if not line:
                self._stop()
                return "failed"
            reply = json.loads(line)
            if reply["verdict"] == "failed":
                log.warning("math reward: the sympy checker failed on %r vs %r: %s", a, b, reply.get("error"))
            return str(reply["verdict"])

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def _start(self) -> None:
        self._pending = b""
        self._proc = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), "--serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True,
        )
        if self._read_line(time.monotonic() + STARTUP_TIMEOUT_S) != b"ready":
            self._stop()
            raise RuntimeError(f"math reward: the sympy checker did not start within {STARTUP_TIMEOUT_S:.0f} s "
                               f"({sys.executable} {__file__} --serve); check that sympy imports")

    def _read_line(self, deadline: float) -> bytes | None:
        """One line from the child; None past the deadline, b"" if the child closed its output."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b""
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.kill()
        proc.wait(timeout=10)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()

    def close(self) -> None:
        with self._lock:
            self._stop()


_shared: SymbolicChecker | None = None
_shared_lock = threading.Lock()


def shared_checker() -> SymbolicChecker:
    """One checker for the whole process (`answers_equivalent`), closed at exit."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = SymbolicChecker()
            atexit.register(_shared.close)
        return _shared


# -- the child side: LaTeX subset -> sympy ---------------------------------------------------

_TOKEN = re.compile(r"\s*(\d+\.?\d*|\.\d+|\\[a-zA-Z]+|\*\*|[a-zA-Z]|[-+*/^()\[\]{},!|=_])")
_FUNCTIONS = ("sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan", "ln", "log", "exp")
_WORD_FUNCTIONS = _FUNCTIONS + ("sqrt", "pi")


class _ParseError(ValueError):
    pass


def _tokens(s: str) -> list[str]:
    tokens, i = [], 0
    s = s.replace("\\cdot", "*").replace("\\times", "*").replace("\\div", "/")
    for word in _WORD_FUNCTIONS:  # plain-text spellings: sqrt(2), pi, log(x)
        s = re.sub(rf"(?<![\\a-zA-Z]){word}(?![a-zA-Z])", rf"\\{word} ", s)
    while i < len(s):
        m = _TOKEN.match(s, i)
        if not m:
            if s[i:].strip():
                raise _ParseError(f"unexpected {s[i:i + 10]!r}")
            break
        tokens.append("^" if m.group(1) == "**" else m.group(1))
        i = m.end()
    letters = "".join(t if len(t) == 1 and t.isalpha() else " " for t in tokens)
    if any(len(run) >= 3 for run in letters.split()):
        raise _ParseError("a word, not a formula")
    return tokens


class _Parser:
    """expr := term (± term)*; term := unary ((* | / | juxtaposition) unary)*; power := postfix (^ unary)?"""

    def __init__(self, tokens: list[str], sympy: Any) -> None:
        self.t, self.i, self.sp = tokens, 0, sympy

    def peek(self) -> str | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise _ParseError(f"expected {expected or 'more'}, got {tok!r}")
        self.i += 1
        return tok

    def expr(self) -> Any:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        return value

    def term(self) -> Any:
        value = self.unary()
        while True:
            tok = self.peek()
            if tok in ("*", "/"):
                self.take()
                value = value * self.unary() if tok == "*" else value / self.unary()
            elif tok is not None and (tok[0].isalnum() or tok in ("(", "{", ".") or
                                      (tok.startswith("\\") and tok != "\\infty")):
                value = value * self.power()
            else:
                return value

    def unary(self) -> Any:
        if self.peek() in ("+", "-"):
            return -self.unary() if self.take() == "-" else self.unary()
        return self.power()

    def power(self) -> Any:
        base = self.postfix()
        if self.peek() == "^":
            self.take()
            return base ** self.unary()
        return base

    def postfix(self) -> Any:
        value = self.atom()
        while self.peek() == "!":
            self.take()
            value = self.sp.factorial(value)
        return value

    def group(self) -> Any:
        """A braced group, or a single token as LaTeX allows (\\frac12, x^2)."""
        if self.peek() == "{":
            self.take()
            value = self.expr()
            self.take("}")
            return value
        tok = self.peek()
        if tok is not None and tok.isdigit() and len(tok) > 1:  # \frac12: one digit per argument
            self.t[self.i] = tok[1:]
            return self.sp.Integer(int(tok[0]))
        return self.atom()

    def atom(self) -> Any:
        sp, tok = self.sp, self.take()
        if tok[0].isdigit() or tok[0] == ".":
            return sp.Rational(tok)
        if tok.isalpha() and len(tok) == 1:
            return sp.E if tok == "e" else sp.Symbol(tok)
        if tok in ("(", "{", "["):
            value = self.expr()
            self.take({"(": ")", "{": "}", "[": "]"}[tok])
            return value
        if tok == "|":
            value = self.expr()
            self.take("|")
            return sp.Abs(value)
        if tok == "\\frac":
            return self.group() / self.group()
        if tok == "\\sqrt":
            if self.peek() == "[":
                self.take()
                index = self.expr()
                self.take("]")
                return sp.root(self.group(), index)
            return sp.sqrt(self.group())
        if tok == "\\pi":
            return sp.pi
        if tok == "\\infty":
            return sp.oo
        if tok[1:] in _FUNCTIONS:
            fn = {"ln": sp.log, "arcsin": sp.asin, "arccos": sp.acos, "arctan": sp.atan}.get(tok[1:])
            arg = self.power() if self.peek() not in ("(", "{") else self.atom()
            return (fn or getattr(sp, tok[1:]))(arg)
        raise _ParseError(f"unsupported {tok!r}")


def _parse_answer(s: str, sympy: Any) -> tuple[str, list[Any]]:
    """("(]", items) for a bracketed list/interval, (",", items) for a bare list, ("", [expr]) otherwise."""
    tokens = _tokens(s)
    if not tokens:
        raise _ParseError("empty")
    list_depth = 1 if tokens[0] in ("(", "[") else 0
    depth, commas = 0, []
    for k, tok in enumerate(tokens):
        depth += 1 if tok in ("(", "[", "{") else -1 if tok in (")", "]", "}") else 0
        if tok == "," and depth == list_depth:
            commas.append(k)
    if not commas:
        return "", [_parse_all(tokens, sympy)]
    bracketed = tokens[0] in ("(", "[") and tokens[-1] in (")", "]") and _closes_at_end(tokens)
    inner = tokens[1:-1] if bracketed else tokens
    shift = 1 if bracketed else 0
    pieces, start = [], 0
    for k in commas:
        pieces.append(inner[start : k - shift])
        start = k - shift + 1
    pieces.append(inner[start:])
    kind = tokens[0] + tokens[-1] if bracketed else ","
    return kind, [_parse_all(piece, sympy) for piece in pieces]


def _closes_at_end(tokens: list[str]) -> bool:
    depth = 0
    for k, tok in enumerate(tokens):
        depth += 1 if tok in ("(", "[") else -1 if tok in (")", "]") else 0
        if depth == 0 and k < len(tokens) - 1:
            return False
    return True


def _parse_all(tokens: list[str], sympy: Any) -> Any:
    parser = _Parser(tokens, sympy)
    value = parser.expr()
    if parser.peek() is not None:
        raise _ParseError(f"unexpected {parser.peek()!r}")
    return value


def _same(a: Any, b: Any, sympy: Any) -> bool:
    if a == b:
        return True
    if a.has(sympy.oo, -sympy.oo, sympy.zoo) or b.has(sympy.oo, -sympy.oo, sympy.zoo):
        return False
    diff = sympy.simplify(a - b)
    if diff == 0:
        return True
    if diff.free_symbols:
        return False
    value = complex(sympy.N(diff, 30))
    scale = max(1.0, abs(complex(sympy.N(b, 30))))
    return abs(value) <= REL_TOL * scale


def symbolic_equal(a: str, b: str) -> bool:
    """Equal as expressions, or as lists/intervals item by item (a bare comma list in any order)."""
    import sympy  # type: ignore[import-untyped]

    (kind_a, items_a), (kind_b, items_b) = _parse_answer(a, sympy), _parse_answer(b, sympy)
    if kind_a != kind_b or len(items_a) != len(items_b):
        return False
    if kind_a != ",":
        return all(_same(x, y, sympy) for x, y in zip(items_a, items_b))
    unmatched = list(items_b)
    for x in items_a:
        hit = next((k for k, y in enumerate(unmatched) if _same(x, y, sympy)), None)
        if hit is None:
            return False
        unmatched.pop(hit)
    return True


def _serve() -> None:
    """The child's loop: one JSON request per line in, one verdict per line out."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    import sympy  # type: ignore[import-untyped]  # noqa: F401  (imported before "ready": no check pays for it)

    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        reply: dict[str, str] = {}
        try:
            reply["verdict"] = "equal" if symbolic_equal(request["a"], request["b"]) else "different"
        except (_ParseError, ArithmeticError, TypeError, ValueError, MemoryError, RecursionError):
            reply["verdict"] = "different"  # not a formula we read, or sympy refused it: not shown equal
        except Exception as exc:  # a checker bug: reported as check_failed, never as a silent wrong answer
            reply = {"verdict": "failed", "error": f"{type(exc).__name__}: {exc}"[:300]}
        out.write(json.dumps(reply) + "\n")
        out.flush()


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


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    _serve()

"""The symbolic half of the math reward: a small LaTeX parser that builds sympy expressions, and
the child process that runs it.

Checks run in a long-lived child, one at a time, killed by pid and restarted when a check runs past
its timeout. A process, not a thread: sympy can spin for ever on adversarial input (10^{10^{10}}),
and a thread cannot be stopped; it would keep a core and its memory after we gave up on it. The
child is this file run as a script (`python -I math_symbolic.py --serve`), so it imports only the
standard library and sympy, never areal or torch. Formulas are parsed by our own recursive-descent
parser, never `eval`ed (sympy's `parse_expr` evals, and its LaTeX parser needs antlr).

Not supported (parse errors, so "different"): equations with terms on both sides, sets written with
\\{ \\}, matrices, \\log_b, \\sin^2 x, words of three or more letters.
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


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    _serve()

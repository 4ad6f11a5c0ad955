"""The math judge's child process: `verdict.py` run as a script, killed by pid at each answer's time limit.

A process, not a thread: sympy can spin for ever on adversarial input (`3^{3^{20}}`), and a thread
cannot be stopped; it would keep a core and its memory after we gave up on it. This is also why
math-verify's own timeouts stay off: they use `signal.alarm`, which works only on a main thread
(in one peer every math reward silently became 0 inside thread-pooled workers; turning the
timeouts off then hung training). Here one check runs at a time; past its limit the child is
killed and the check answers "timeout"; the next check starts a fresh child (its start is not
part of any check's budget). The child is `python -I verdict.py --serve`: it imports
sympy and math-verify, never areal or torch.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 60.0  # python, sympy and math-verify's grammar on a loaded 2-core machine; not a check's budget
CHILD = Path(__file__).with_name("verdict.py")


@dataclass(frozen=True)
class Verdict:
    outcome: str  # "equal", "different", "timeout" (killed at the limit) or "failed" (the judge broke)
    detail: str = ""


class MathJudge:
    """A child process answering one check at a time; killed by pid on a timeout, restarted lazily."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._pending = b""
        self._lock = threading.Lock()

    def check(self, reference: str, answer: str, timeout_s: float) -> Verdict:
        """Whether `answer` equals `reference`, decided within `timeout_s` seconds or killed."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            proc = self._proc
            assert proc is not None and proc.stdin is not None
            try:
                proc.stdin.write(json.dumps({"reference": reference, "answer": answer}).encode() + b"\n")
                proc.stdin.flush()
            except BrokenPipeError:
                self._stop()
                return Verdict("failed", "the judge process closed its input")
            line = self._read_line(time.monotonic() + timeout_s)
            if line is None:
                self._stop()
                return Verdict("timeout", f"no verdict within {timeout_s:g} s: the judge process was killed")
            if not line:
                self._stop()
                return Verdict("failed", "the judge process exited")
            reply = json.loads(line)
            if reply["verdict"] == "failed":
                log.warning("math judge failed on %r vs %r: %s", answer, reference, reply.get("error"))
            return Verdict(str(reply["verdict"]), str(reply.get("error", "")))

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def _start(self) -> None:
        self._pending = b""
        self._proc = subprocess.Popen(
            [sys.executable, "-I", str(CHILD), "--serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True,
        )
        if self._read_line(time.monotonic() + STARTUP_TIMEOUT_S) != b"ready":
            self._stop()
            raise RuntimeError(f"math reward: the judge process did not start within {STARTUP_TIMEOUT_S:.0f} s "
                               f"({sys.executable} -I {CHILD} --serve); check that math-verify imports "
                               f"(pip install 'math-verify>=0.9,<0.10')")

    def _read_line(self, deadline: float) -> bytes | None:
        """One line from the child; None past the deadline, b"" if the child closed its output."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        readable = select.poll()  # not select.select, which refuses an fd past 1023 (a process holding many sockets)
        readable.register(fd, select.POLLIN)
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not readable.poll(left * 1000):
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


_shared: MathJudge | None = None
_shared_lock = threading.Lock()


def shared_judge() -> MathJudge:
    """One judge for the whole process (`answers_equivalent`), closed at exit."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = MathJudge()
            atexit.register(_shared.close)
        return _shared

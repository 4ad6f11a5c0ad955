"""The signals that end a run, each handled as SIGTERM is: stop the workers, checkpoint, clean up.

A terminal sends SIGINT (Ctrl-C) or, when it closes, SIGHUP; a scheduler sends SIGTERM, often
more than once. The first of them raises `Stopped` in the controller's loop, which then stops
every worker with an exit checkpoint and removes its socket files; any later one is logged and
ignored, so it cannot cut that cleanup short. After SIGHUP the terminal is gone: writing to it
would fail, so the process's terminal streams go to /dev/null (the run's log keeps everything).
"""

from __future__ import annotations

import logging
import os
import signal
import stat
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

log = logging.getLogger("areal.controller")

ENDING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """A run ended by a signal; its exit status is the shell's convention, 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {self.name}")

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def said(self) -> str:
        """What the user is told: Ctrl-C is an interrupt; any other signal is named."""
        return "interrupted" if self.signum == signal.SIGINT else f"stopped by {self.name}"


class EndingSignals:
    """While entered: the first ending signal raises `Stopped`; later ones, or any while `stopping()`, are ignored."""

    def __init__(self, stopping: Callable[[], bool]) -> None:
        self.stopping = stopping
        self.received: list[int] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> EndingSignals:
        self._previous = {sig: signal.signal(sig, self._handle) for sig in ENDING}
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            _leave_terminal()
        first = not self.received and not self.stopping()
        self.received.append(signum)
        if not first:
            log.warning("%s while stopping: ignored, the run is already stopping", signal.Signals(signum).name)
            return
        log.info("%s: stopping the run (exit checkpoint, then cleanup)", signal.Signals(signum).name)
        raise Stopped(signum)


def _leave_terminal() -> None:
    """Point the standard streams that are a terminal at /dev/null: the terminal that sent SIGHUP is gone.

    A hung-up terminal no longer answers isatty(), so any character device is taken (pipes and files stay)."""
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in (0, 1, 2):
            try:
                device = stat.S_ISCHR(os.fstat(fd).st_mode)
            except OSError:
                continue
            if device:
                os.dup2(null, fd)
    finally:
        os.close(null)

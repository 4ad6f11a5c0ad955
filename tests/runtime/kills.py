"""Killing one worker mid-run, once, from the controller's event hook (`build_controller(on_event=...)`), and
waiting for any process to end."""

from __future__ import annotations

import os
import select
import signal
from collections.abc import Callable
from typing import Any


class KillOnce:
    """SIGKILL `worker_id`'s process the first time an event finds it up at `at_version` or later (and, given
    `when`, with `when(controller)` true); `killed` holds the pid it killed (empty until then), so a test can
    tell the replacement from it."""

    def __init__(self, worker_id: str, at_version: int = 0, when: Callable[[Any], bool] | None = None) -> None:
        self.worker_id, self.at_version, self.when = worker_id, at_version, when
        self.killed: list[int] = []

    def __call__(self, controller) -> None:
        worker = controller.workers[self.worker_id]
        if not self.killed and controller.state.version >= self.at_version and worker.ready \
                and worker.process.poll() is None and (self.when is None or self.when(controller)):
            os.kill(worker.process.pid, signal.SIGKILL)
            self.killed.append(worker.process.pid)


def exits_within(pid: int, timeout_s: float) -> bool:
    """True once the process has exited (its pidfd turns readable), whoever its parent is."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        exited = select.poll()  # any descriptor: a test may hold more than 1023 files (tests/descriptors.py)
        exited.register(fd, select.POLLIN)
        return bool(exited.poll(timeout_s * 1000))
    finally:
        os.close(fd)

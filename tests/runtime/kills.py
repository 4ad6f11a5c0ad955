"""Killing one worker mid-run, once, from the controller's event hook (`build_controller(on_event=...)`)."""

from __future__ import annotations

import os
import signal


class KillOnce:
    """SIGKILL `worker_id`'s process the first time an event finds it up at `at_version` or later; `killed` holds
    the pid it killed (empty until then), so a test can tell the replacement from it."""

    def __init__(self, worker_id: str, at_version: int = 0) -> None:
        self.worker_id, self.at_version = worker_id, at_version
        self.killed: list[int] = []

    def __call__(self, controller) -> None:
        worker = controller.workers[self.worker_id]
        if not self.killed and controller.state.version >= self.at_version and worker.ready \
                and worker.process.poll() is None:
            os.kill(worker.process.pid, signal.SIGKILL)
            self.killed.append(worker.process.pid)

"""The controller's stop reads what each worker sent last (its exit checkpoint, "stopped"), even when every
worker process had exited before the controller listened, and does not wait for a message that cannot come."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from areal.runtime.controller.controller import Controller
from areal.runtime.controller.run_state import WorkerProcess
from areal.runtime.wire import messages as msg


class Exited:
    """A worker process that has exited."""

    pid, node = 4242, "local"

    def poll(self) -> int:
        return 0

    def kill(self) -> None:
        pass


def _stopping_controller(tmp_path: Path, arrives: list[msg.Message]) -> tuple[SimpleNamespace, list[int]]:
    """A controller's state as `_shutdown` reads it: one trainer, exited; `arrives` is what its socket holds."""
    worker = WorkerProcess("actor[0]", "actor", 0, Exited(), tmp_path / "actor-0.log")
    listens: list[int] = []

    def listen(timeout_ms: int) -> None:
        listens.append(timeout_ms)
        for m in arrives:  # as Controller._handle would
            Controller._on_heartbeat(controller, worker, m)
        arrives.clear()

    controller = SimpleNamespace(
        _stopping=False, state=SimpleNamespace(status="running"), on_event=lambda c: None, run_dir=tmp_path,
        versions=SimpleNamespace(current={"actor": 0}), workers={worker.worker_id: worker},
        plan=SimpleNamespace(pool=lambda name: SimpleNamespace(role="train")),
        control=SimpleNamespace(send=lambda *a: None), _listen=listen,
        _unsealed=lambda staged: None)  # at version 0 no exit checkpoint is asked for
    return controller, listens


def test_a_stopped_message_that_arrives_after_its_worker_exited_is_still_read(tmp_path):
    controller, listens = _stopping_controller(tmp_path, [msg.Stopped(batches=3, samples=9, tokens=27)])
    Controller._shutdown(controller, healthy=True)
    assert listens == [100] and controller.workers["actor[0]"].counts == {"batches": 3, "samples": 9, "tokens": 27}
    assert controller.state.status == "stopped"


def test_a_worker_that_died_without_a_word_is_not_waited_for(tmp_path):
    controller, listens = _stopping_controller(tmp_path, [])
    Controller._shutdown(controller, healthy=True)
    assert listens == [100] and controller.workers["actor[0]"].counts == {}  # one listen, not 60 s of them

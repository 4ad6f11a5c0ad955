"""A Ray worker that ends by a Ray error carries Ray's stated cause into the controller's report: an exit code of
-9 alone does not tell a lost node, a failed health check, `ray.kill` and a crash apart. Ray itself is faked here:
the handle reads only its `wait`, `get`, `kill` and exception classes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from areal.runtime.controller.launchers import WorkerSpec
from areal.runtime.controller.ray_launcher import RayHandle


class RayError(Exception):
    pass


class RayActorError(RayError):
    pass


def handle(outcome: object) -> RayHandle:
    """A handle whose actor was placed and whose `run` call ended with `outcome` (a return value, or raised)."""

    def get(ref: str) -> object:
        if ref == "where":
            return 4242, "127.0.0.1", "node-1"
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    ray = SimpleNamespace(exceptions=SimpleNamespace(RayError=RayError, RayActorError=RayActorError), get=get,
                          wait=lambda refs, timeout: (refs, []), kill=lambda actor, no_restart: None)
    launcher = SimpleNamespace(ray=ray, away=lambda spec: None, label=lambda ip, node: ip, release=lambda spec: None)
    actor = SimpleNamespace(where=SimpleNamespace(remote=lambda: "where"),
                            run=SimpleNamespace(remote=lambda *args: "done"))
    spec = WorkerSpec(pool="actor", replica=0, replicas=1, args=(), log_path=Path("actor-0.log"))
    return RayHandle(launcher, spec, actor)  # type: ignore[arg-type]


@pytest.mark.parametrize("error, code", [
    (RayActorError("The actor died unexpectedly before finishing this task.\n\tclass_name: WorkerActor\n"
                   "The actor is dead because its node has died. Node Id: abc"), -9),
    (RayError("the task failed:\nTraceback ..."), 1),
])
def test_a_ray_error_gives_its_exit_code_and_rays_cause_in_one_line(error, code):
    h = handle(error)
    assert h.poll() == code
    assert h.ended_by is not None and "\n" not in h.ended_by
    assert h.ended_by == "Ray: " + " ".join(str(error).split())


def test_an_exception_the_call_raised_is_named_not_the_frames_ray_wraps_it_in():
    error = RayError("ray::WorkerActor.run() (pid=1)\n  File \"main.py\", line 3, in run\n" + "  ^^^^\n" * 80)
    error.cause = FileNotFoundError(2, "No such file or directory", "checkpoints/step-2")
    h = handle(error)
    assert h.poll() == 1
    assert h.ended_by == "Ray: FileNotFoundError: [Errno 2] No such file or directory: 'checkpoints/step-2'"


def test_a_long_cause_is_cut_and_a_worker_that_returned_has_none():
    long = handle(RayActorError("x " * 400))
    assert long.poll() == -9 and long.ended_by is not None
    assert len(long.ended_by) < 320 and long.ended_by.endswith("...")
    returned = handle(3)
    assert returned.poll() == 3 and returned.ended_by is None

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


class ActorUnavailableError(RayActorError):
    pass


def handle(outcome: object, *endings: object, killed: list[str] | None = None,
           answered: set[str] | None = None) -> RayHandle:
    """A handle whose actor was placed and whose `run` call ended with `outcome` (a return value, or raised); the
    calls to its `ending` that follow give `endings` in turn, once the test adds "ending" to `answered`."""
    answers = iter(endings)
    answered = {"done"} if answered is None else answered

    def get(ref: str) -> object:
        if ref == "where":
            return 4242, "127.0.0.1", "node-1"
        result = outcome if ref == "done" else next(answers)
        if isinstance(result, Exception):
            raise result
        return result

    errors = SimpleNamespace(RayError=RayError, RayActorError=RayActorError,
                             ActorUnavailableError=ActorUnavailableError)
    killed = [] if killed is None else killed
    ray = SimpleNamespace(exceptions=errors, get=get, kill=lambda actor, no_restart: killed.append("killed"),
                          wait=lambda refs, timeout: ([r for r in refs if r in answered], []))
    launcher = SimpleNamespace(ray=ray, away=lambda spec: None, label=lambda ip, node: ip, release=lambda spec: None)
    actor = SimpleNamespace(where=SimpleNamespace(remote=lambda: "where"),
                            run=SimpleNamespace(remote=lambda *args: "done"),
                            ending=SimpleNamespace(remote=lambda: "ending"))
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


@pytest.mark.parametrize("ending, code, ended_by", [
    ((0, None), 0, None),
    ((1, "ValueError: no such pool"), 1, "its run raised ValueError: no such pool"),
    (RayActorError("The actor died because its node has died."), -9, "Ray: The actor died because its node has died."),
    (None, 1, "Ray: its run call was lost before it started (the connection to its actor failed)"),
])
def test_a_connection_blip_is_not_an_end_the_actor_is_asked_how_its_run_ends(ending, code, ended_by, caplog):
    # Ray: the actor is "temporarily unavailable", the call "may or may not have been executed" (its worker may
    # run on): taking that for a death killed a live trainer
    killed: list[str] = []
    answered = {"done"}
    h = handle(ActorUnavailableError("The actor abc is unavailable: connection reset"), ending, killed=killed,
               answered=answered)
    assert h.poll() is None and h.poll() is None  # `ending` not answered yet: the worker runs
    assert killed == [] and h.ended_by is None
    assert "actor[0]: the connection to its Ray actor failed (Ray: The actor abc is unavailable" in caplog.text
    answered.add("ending")  # run returned (or the actor died): `ending` answers
    assert h.poll() == code and h.ended_by == ended_by
    assert killed == ["killed"]  # the ended actor's bundle freed, as after any end


def test_a_blip_while_asking_asks_again():
    h = handle(ActorUnavailableError("unavailable"), ActorUnavailableError("unavailable again"), (0, None),
               answered={"done", "ending"})
    assert h.poll() is None  # run's result lost: ask
    assert h.poll() is None  # the question's answer lost too: ask again
    assert h.poll() == 0


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_a_real_actor_asked_while_its_run_runs_answers_how_the_run_ended(tmp_path):
    # what the blip handling relies on: the actor takes one call at a time, so `ending`, made while `run` runs,
    # answers after it, with its outcome (here run fails at once: its plan does not exist)
    ray = pytest.importorskip("ray")
    from areal.runtime.controller.ray_launcher import WorkerActor

    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        actor = ray.remote(max_restarts=0)(WorkerActor).remote()
        plan = tmp_path / "no-plan.json"
        done = actor.run.remote([str(plan), "actor", "0"], str(tmp_path / "actor-0.log"))
        ending = actor.ending.remote()
        with pytest.raises(ray.exceptions.RayTaskError):
            ray.get(done, timeout=120)
        code, raised = ray.get(ending, timeout=60)
        assert code == 1 and raised.startswith("FileNotFoundError") and str(plan) in raised
    finally:
        ray.shutdown()

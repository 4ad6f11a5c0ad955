"""A node call that lasts far longer than its kind's is said while it lasts, with where the node's code is (a node
stuck in Python keeps its worker's pulses coming, so nothing else says why the run stopped moving)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from areal import Float, Graph, node
from areal.cli.run import build_controller
from areal.runtime.controller.run_status import snapshot
from areal.runtime.worker import chain
from areal.runtime.worker.chain import LongCalls, guard
from areal.view.run_files import _pools
from tests.spawned import end_session

FAKE_RL = Path(__file__).with_name("fake_rl.py")


@node(inputs={"reward": Float["S"]}, outputs={"shaped": Float["S"]})
def shape(batch):
    return {"shaped": batch["reward"]}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def asked(calls: LongCalls) -> str:
    """What the pulse thread would send now: said() from a thread of its own, as it runs."""
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.append(calls.said()))
    reader.start()
    reader.join()
    return said[0]


def _node():
    g = Graph("long-calls")
    g.add(shape)
    return g.nodes["shape"]


def test_a_call_past_the_floor_and_ten_times_its_kinds_longest_is_said_with_where_its_code_is(monkeypatch, caplog):
    clock, n = Clock(), _node()
    calls = LongCalls(floor_s=60.0, clock=clock)
    monkeypatch.setattr(chain, "LONG_CALLS", calls)

    def lasting(seconds: float) -> list[str]:  # the node's code: time passes in it, the pulse thread asks twice
        clock.now += seconds
        return [asked(calls), asked(calls)]

    assert asked(calls) == ""  # in no call
    first, again = guard(n, lasting, 61.0)
    assert first == again
    assert first.startswith("tests/runtime/test_long_calls.py:")
    assert ": node 'shape' (custom) has been in a call for 61 s (its first), at test_long_calls.py:" in first
    assert " in lasting → " in first and first.endswith(" in wait")  # the node's own frame, … what it waits in
    stacks = [r.getMessage() for r in caplog.records if "its stack:" in r.getMessage()]
    assert len(stacks) == 1 and "in lasting" in stacks[0]  # the whole stack to the worker's log, once a call
    assert guard(n, lasting, 59.0) == ["", ""]  # under the floor
    # the kind's longest is now 61 s: a call is long past 610 s, not 60
    assert guard(n, lasting, 609.0) == ["", ""]
    assert "has been in a call for 6100 s (its longest before: 609.0 s)" in guard(n, lasting, 6100.0)[0]
    assert asked(calls) == ""  # the call returned


def test_each_method_is_its_own_kind_and_a_call_inside_a_call_is_the_outer_ones(monkeypatch):
    clock, n = Clock(), _node()
    calls = LongCalls(floor_s=60.0, clock=clock)
    monkeypatch.setattr(chain, "LONG_CALLS", calls)

    class Engine:
        def step(self, seconds: float) -> str:
            clock.now += seconds
            return asked(calls)

        def receive(self) -> str:
            clock.now += 100.0
            return guard(n, self.step, 5.0)  # inside: the outer call is the one timed and said

    engine = Engine()
    said = guard(n, engine.receive)
    assert "node 'shape' (custom) has been in receive() for 105 s (its first), at test_long_calls.py:" in said
    assert "at test_long_calls.py:" in said and " in step → " in said  # from the innermost node code it is in
    # the inner step() was not timed: step()'s first call of its own is its first
    assert "has been in step() for 70 s (its first)" in guard(n, engine.step, 70.0)


def test_a_run_shows_the_trainer_held_in_one_step_then_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_HOLD_AT", "2")  # the update of version 2 waits for run_dir/release
    run = tmp_path / "run"
    shown: list[str] = []
    viewed: list[dict] = []

    def watch(controller) -> None:
        for w in controller.workers.values():
            if w.long_call and not shown:
                shown.append(w.long_call)
                viewed.append(_pools(controller.plan, snapshot(controller, {})))  # as status.json and the view have it
                (run / "release").touch()

    controller = build_controller(FAKE_RL, ["steps=4", "faults.long_call_s=1"], run, on_event=watch)
    state = controller.run()
    assert state.version == 4
    assert shown and "fake_rl.py:" in shown[0] and "node 'actor' (ppo-update) has been in a call for" in shown[0]
    assert "fake_nodes.py:" in shown[0] and " in __call__ → " in shown[0]  # where the trainer's code waits
    assert len(state.long_calls) == 1 and state.long_calls[0].startswith("actor[0]: ")
    assert viewed[0]["actor"]["long_calls"] == shown and viewed[0]["rollout"]["long_calls"] == []
    assert "its stack:" in (run / "logs" / "actor-0.log").read_text()
    assert "has been in a call" in (run / "logs" / "controller.log").read_text()


def test_a_quiet_run_prints_a_long_call_once_as_it_is_first_said(tmp_path):
    """`areal run -q` shows no live view: a run stuck in a node must still say so on its console."""
    run, root = tmp_path / "run", Path(__file__).resolve().parents[2]
    argv = [sys.executable, "-m", "areal.cli", "run", "tests/runtime/fake_rl.py", "-q", "--run-dir", str(run),
            "--set", "steps=4", "--set", "faults.long_call_s=1"]
    env = {**os.environ, "FAKE_HOLD_AT": "2", "COLUMNS": "1000"}  # the update of version 2 waits for run/release
    proc = subprocess.Popen(argv, cwd=root, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        before = []
        for line in proc.stderr:  # as the run says it
            before.append(line)
            if line.startswith("long node call:"):
                (run / "release").touch()
                break
        _, after = proc.communicate(timeout=120)
    finally:
        (run / "release").touch()
        end_session(proc)
    assert proc.returncode == 0, "".join(before) + after
    assert before[-1].startswith("long node call: actor[0]: ") and "has been in a call for" in before[-1]
    assert "long node call:" not in after  # once (the summary's row keeps it)

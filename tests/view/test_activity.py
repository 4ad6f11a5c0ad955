"""The live numbers on the graph, from hand-made span files: each worked out by hand in the comments."""

from __future__ import annotations

import json

from pytest import approx

from areal.runtime.compiler.plan import Channel, Plan, PoolSpec
from areal.runtime.records.spans import span_files
from areal.view.activity import WINDOW_S, Activity

S = 1_000_000  # µs
T0 = 1_800_000_000 * S  # the window ends here


def _plan(tmp_path) -> Plan:
    pools = (PoolSpec("tasks", ("tasks",), ("source",), "source", 1, 1),
             PoolSpec("rollout", ("rollout", "score"), ("generate", "reward"), "stream", 2, 1),
             PoolSpec("actor", ("actor",), ("ppo-update",), "train", 1, 1))
    channels = (Channel("tasks", "rollout", ("tasks.prompt",), ("ipc://a",)),
                Channel("rollout", "actor", ("score.reward",), ("ipc://b",)))
    return Plan("g", "r.py", (), str(tmp_path), pools, channels, (), "ipc://c", (("actor", "rollout"),), "w", 64,
                1 << 20, 1 << 20, policy="actor")


def _write(run_dir, worker, *spans):
    path = span_files(run_dir, worker)[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as file:
        for cat, name, start_s, dur_s, args in spans:
            file.write(json.dumps({"cat": cat, "name": name, "ts": T0 + int(start_s * S), "dur": int(dur_s * S),
                                   "args": args}) + "\n")


def test_busy_rates_and_waits_over_the_window(tmp_path):
    plan = _plan(tmp_path)
    w = WINDOW_S
    _write(tmp_path, "rollout[0]",
           ("decode", "rollout", -w - 1, 2, {}),  # 1 s of it inside the window
           ("decode", "rollout", -5, 3, {}),
           ("node", "score", -2, 0.5, {"samples": 8}),
           ("send", "send to actor", -1.5, 0.5, {"to": "actor", "group": 0, "samples": 8}),
           ("weights", "load weights", -1, 0.1, {"model": "actor", "version": 3}))
    _write(tmp_path, "rollout[1]", ("node", "score", -3, 1.5, {"samples": 8}),
           ("send", "send to actor", -0.5, 0.25, {"to": "actor", "group": 1, "samples": 8}))
    _write(tmp_path, "actor[0]", ("wait", "wait", -4, 2, {"groups": [0, 1], "version": 4, "straggler": 1,
                                                          "admitted_at": 2}),
           ("step", "train step", -2, 1, {"version": 4}), ("node", "actor", -2, 0.8, {"samples": 16}),
           ("publish", "publish weights", -1.2, 0.2, {"version": 4}))
    activity = Activity(tmp_path, plan)
    activity.update()
    got = activity.summary(T0)
    # rollout: (1 + 3) s of decoding over 2 replicas x 10 s; score: (0.5 + 1.5) s likewise, 16 samples in 10 s
    nodes = {name: {k: v for k, v in node.items() if k != "last_call"} for name, node in got["nodes"].items()}
    assert nodes["rollout"] == approx({"busy": 4 / (2 * w), "samples_per_s": 0.0, "calls": 0})
    assert nodes["score"] == approx({"busy": 2 / (2 * w), "samples_per_s": 16 / w, "calls": 2})
    assert nodes["actor"] == approx({"busy": 0.8 / w, "samples_per_s": 16 / w, "calls": 1})
    assert got["nodes"]["score"]["last_call"] == approx({"seconds": 0.5, "ago_s": 1.5})  # rollout[0]'s, the newer
    assert got["channels"]["channel:rollout:actor"] == approx({"samples_per_s": 16 / w, "groups_per_s": 2 / w,
                                                              "blocked": 0.75 / (2 * w)})
    trainer = got["trainers"]["actor"]
    assert trainer["waiting"] == approx(2 / w)
    assert trainer["last_wait"] == {"groups": [0, 1], "version": 4, "straggler": 1, "admitted_at": 2,
                                    "seconds": 2.0, "ago_s": 2.0}
    assert trainer["training_s"] is None  # its step ended after the wait: idle since
    assert got["followers"] == {"rollout[0]": {"actor": {"version": 3, "ago_s": approx(0.9)}}}
    assert got["published"] == {"actor": {"version": 4, "ago_s": 1.0}}


def test_a_short_run_is_measured_over_its_own_time(tmp_path):
    _write(tmp_path, "actor[0]", ("node", "actor", -2, 1, {"samples": 8}))
    activity = Activity(tmp_path, _plan(tmp_path))
    activity.update()
    got = activity.summary(T0, since_us=T0 - 4 * S)  # the run started 4 s before the window's end
    assert got["window_s"] == 4.0
    assert got["nodes"]["actor"] == approx({"busy": 0.25, "samples_per_s": 2.0, "calls": 1,
                                            "last_call": approx({"seconds": 1.0, "ago_s": 1.0})})


def test_spans_written_since_the_last_read_are_added(tmp_path):
    activity = Activity(tmp_path, _plan(tmp_path))
    activity.update()
    assert activity.summary(T0)["nodes"] == {}
    _write(tmp_path, "actor[0]", ("node", "actor", -1, 1, {"samples": 4}))
    activity.update()
    assert activity.summary(T0)["nodes"]["actor"]["calls"] == 1


def test_a_step_longer_than_the_window_shows_as_under_way_with_its_last_call(tmp_path):
    w = WINDOW_S
    _write(tmp_path, "actor[0]", ("node", "actor", -3 * w, 1.5 * w, {"samples": 8}),  # the last step: long ago
           ("step", "train step", -3 * w, 1.5 * w, {"version": 1}),
           ("wait", "wait", -w, 1, {"groups": [2, 3], "version": 2}))  # then its next step began
    activity = Activity(tmp_path, _plan(tmp_path))
    activity.update()
    got = activity.summary(T0)
    assert got["trainers"]["actor"]["training_s"] == w - 1
    assert got["nodes"]["actor"]["calls"] == 0
    assert got["nodes"]["actor"]["last_call"] == {"seconds": 1.5 * w, "ago_s": 1.5 * w}

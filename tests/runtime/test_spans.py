"""A worker's spans: one JSON line each, nested exactly, bounded by rotation, and never a reason for a run to stop."""

from __future__ import annotations

import time

from areal.config import RecordsConfig
from areal.graph.meta import GroupMeta
from areal.runtime.records.spans import Spans, StepWait, span_files
from areal.runtime.records.tail import JsonlTail


def _read(run_dir, worker="actor[0]"):
    return JsonlTail(*span_files(run_dir, worker)).read()


def test_a_child_span_lies_within_its_parent_in_microseconds(tmp_path):
    spans = Spans(tmp_path, "actor[0]", RecordsConfig())
    with spans.timed("step", "train step", version=1) as args:
        with spans.timed("node", "actor", samples=4):
            pass
        args["samples"] = 4  # the block may add to its span's args
    spans.close()
    child, parent = _read(tmp_path)
    assert (child["cat"], child["name"], child["args"]) == ("node", "actor", {"samples": 4})
    assert (parent["cat"], parent["args"]) == ("step", {"version": 1, "samples": 4})
    assert parent["ts"] <= child["ts"] and child["ts"] + child["dur"] <= parent["ts"] + parent["dur"]
    assert abs(parent["ts"] / 1e6 - time.time()) < 60  # microseconds since the epoch


def test_the_files_stay_within_spans_max_mb_and_keep_the_newest(tmp_path):
    settings = RecordsConfig(spans_max_mb=0.01)  # 10 KiB in all: two halves of 5 KiB
    spans = Spans(tmp_path, "rollout[0]", settings)
    now = time.monotonic()
    for k in range(1000):
        spans.add("decode", "rollout", now, now, sequences=k)
    spans.close()
    current, old = span_files(tmp_path, "rollout[0]")
    assert current.stat().st_size + old.stat().st_size <= 0.01 * 2**20
    kept = [s["args"]["sequences"] for s in _read(tmp_path, "rollout[0]")]
    assert kept == list(range(kept[0], 1000))  # the newest, in order, none lost in between


def test_records_spans_false_writes_nothing(tmp_path):
    spans = Spans(tmp_path, "actor[0]", RecordsConfig(spans=False))
    spans.add("node", "actor", 0.0, 1.0)
    assert not (tmp_path / "spans").exists()


def test_a_write_that_fails_stops_the_recording_without_raising(tmp_path, caplog):
    spans = Spans(tmp_path, "actor[0]", RecordsConfig())
    spans._file.close()  # as if the disk went away under it: every write now fails
    spans._file = open("/dev/full", "w")  # noqa: SIM115 (closed by close())
    now = time.monotonic()
    spans.add("node", "actor", now, now + 1.0)  # long: flushed at once, and ENOSPC
    spans.add("node", "actor", now, now + 1.0)
    assert "span recording stopped" in caplog.text and caplog.text.count("span recording stopped") == 1
    spans.close()


def test_a_trainers_wait_names_the_group_whose_arrival_ended_it(tmp_path):
    spans = Spans(tmp_path, "actor[0]", RecordsConfig())
    idle = StepWait(spans)
    idle.arrived(GroupMeta(group=1, samples=4, admitted_at=0))
    idle.arrived(GroupMeta(group=0, samples=4, admitted_at=0))  # came last of step 1's: the step waited on it
    idle.arrived(GroupMeta(group=2, samples=4, admitted_at=0))  # for the next step
    idle.ended([0, 1], version=1)
    idle.restart()
    idle.arrived(GroupMeta(group=3, samples=4, admitted_at=1))
    idle.ended([2, 3], version=2)
    idle.arrived(GroupMeta(group=4, samples=4, admitted_at=1))
    idle.arrived(GroupMeta(group=5, samples=4, admitted_at=2))
    idle.restart()  # both came while step 2 ran: step 3 waited on none
    idle.ended([4, 5], version=3)
    spans.close()
    assert [s["args"] for s in _read(tmp_path)] == [
        {"groups": [0, 1], "version": 1, "straggler": 0, "admitted_at": 0},
        {"groups": [2, 3], "version": 2, "straggler": 3, "admitted_at": 1},
        {"groups": [4, 5], "version": 3},
    ]
    assert idle.arrivals == {}  # each step's groups leave with it

"""Data that could never cross the wire is refused where it enters, with a reason, and nothing hangs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgpack
import pytest
import zmq

from areal.cli.run import build_controller
from areal.errors import ConfigError, RunError

RECIPE = Path(__file__).with_name("fake_rl.py")


def _controller(tmp_path: Path, *overrides: str, on_event=None):
    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    return build_controller(recipe, ["steps=2", "batch_size=2", "group_size=2", *overrides], tmp_path / "run",
                            on_event=on_event)


def _metrics(controller) -> list[dict]:
    lines = (Path(controller.plan.run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_a_frame_limit_too_small_for_any_run_is_refused_at_the_setting(tmp_path):
    with pytest.raises(ConfigError, match=r"--set transport.max_frame_bytes=64: transport.max_frame_bytes: input "
                                          r"should be greater than or equal to 65536"):
        _controller(tmp_path, "transport.max_frame_bytes=64")


def test_a_task_record_too_large_to_send_is_skipped_and_named_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_HUGE_PROMPT_AT", "1")
    controller = _controller(tmp_path, "transport.max_header_bytes=65536")
    state = controller.run()
    assert state.version == 2 and controller.admission.oversized == 1
    skipped = [m["problem"] for m in _metrics(controller) if m["kind"] == "bad_task"]
    assert len(skipped) == 1 and "skipped a task: the batch's header is" in skipped[0]
    assert "over transport.max_header_bytes=65536; its largest json field is 'tasks.prompt'" in skipped[0]
    summary = controller.accounting.summary()
    assert summary["trained"] == 8 and summary["failed"] == 0


def test_a_task_record_msgpack_cannot_carry_is_skipped_and_named_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_UNPACKABLE_AT", "2")  # a task whose tests hold an integer past 64 bits, say
    controller = _controller(tmp_path)
    state = controller.run()
    skipped = [m["problem"] for m in _metrics(controller) if m["kind"] == "bad_task"]
    assert state.version == 2 and len(skipped) == 1
    assert "skipped a task: batch header cannot be packed" in skipped[0]
    assert "field 'tasks.prompt': Integer value out of range" in skipped[0]
    summary = controller.accounting.summary()
    assert summary["trained"] == 8 and summary["failed"] == 0


def test_generated_data_over_the_frame_limit_fails_its_samples_and_stops_the_run_instead_of_hanging(tmp_path,
                                                                                                     monkeypatch):
    monkeypatch.setenv("FAKE_TOKENS", "5000")  # int64 output_ids of a group of 2: 80 kB, over 64 KiB
    controller = _controller(tmp_path, "transport.max_frame_bytes=65536", "staleness=0")
    with pytest.raises(RunError, match=r"no sample of the last \d+ groups reached a trainer since version 0 \(the "
                                       r"last: .*B on the wire, over transport.max_frame_bytes=65536\)"):
        controller.run()
    failed = [m for m in _metrics(controller) if m["kind"] == "failed"]
    assert {f["sample_id"] for f in failed} >= set(range(8))
    assert all("B on the wire, over transport.max_frame_bytes=65536" in f["reason"] for f in failed)
    summary = controller.accounting.summary()
    assert summary["started"] == summary["trained"] + summary["failed"] + summary["in_flight"]


def test_a_frame_without_the_meta_a_worker_needs_is_refused_with_a_reason_and_the_worker_lives(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_ADVANTAGE_POOL", "1")
    sent: list[bool] = []
    header = msgpack.packb({"v": 1, "meta": {"samples": 2}, "size": 1, "fields": [
        {"name": "group_id", "kind": "tensor", "dtype": "int64", "shape": [1], "nbytes": 8}]})

    def inject(controller) -> None:
        worker = controller.workers.get("advantage[0]")
        if sent or worker is None or not worker.ready:
            return
        push = zmq.Context.instance().socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 2000)
        push.connect(controller.plan.inputs_of("advantage")[0].endpoints[0])
        push.send_multipart([header, (999_999).to_bytes(8, "little")])
        push.close()
        sent.append(True)

    controller = _controller(tmp_path, "steps=3", on_event=inject)
    state = controller.run()
    assert sent and state.version == 3
    rejected = [m for m in _metrics(controller) if m["kind"] == "rejected"]
    assert len(rejected) == 1 and "the batch's meta has no 'group'" in rejected[0]["reason"]
    assert not [m for m in _metrics(controller) if m["kind"] == "restart"]
    assert controller.accounting.summary()["trained"] == 12

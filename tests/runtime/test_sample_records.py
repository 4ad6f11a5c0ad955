"""The per-sample records (samples/*.jsonl, `areal samples`) agree, sample by sample, with what the nodes computed
and what the trainer itself recorded it trained."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from areal.cli.run import build_controller
from areal.config import RecordsConfig
from areal.errors import ConfigError
from areal.runtime.records.sample_log import SampleLog
from areal.runtime.records.sample_records import read_samples, select

RECIPE = Path(__file__).with_name("branched_rl.py")


def test_every_trained_filtered_and_scored_sample_is_recorded_as_the_trainer_and_nodes_saw_it(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_FILTER", "1")  # groups that are multiples of 3 are dropped whole, with a reason
    shutil.copy(RECIPE, tmp_path / "branched_rl.py")
    controller = build_controller(tmp_path / "branched_rl.py", ["steps=4"], tmp_path / "run")
    controller.run()
    run = Path(controller.plan.run_dir)
    trainer = [json.loads(line) for line in (run / "trained.jsonl").read_text().splitlines()]  # its own record
    records = read_samples(run)
    trained = {sid: (t["version"], v) for t in trainer for sid, v in zip(t["sample_ids"], t["min_versions"])}
    assert {r.sample_id for r in records.values() if r.status == "trained"} == set(trained)
    for sid, (version, oldest) in trained.items():
        r = records[sid]
        assert (r.step, r.lag) == (version + 1, version - oldest)
        assert r.fields["judge_a.score"] == sid + 0.25 and r.fields["judge_b.score"] == sid + 0.5
        assert r.fields["combine.advantage"] == sid + 0.25 and r.fields["rollout.prompt"] == f"p{r.group_id}"
        assert r.fields["rollout.versions"]["min"] == oldest  # a per-token output, summarised
    filtered = [r for r in records.values() if r.status == "filtered"]
    assert filtered and all(r.group_id % 3 == 0 and r.node == "every_third_group" and r.reason == "a multiple of 3"
                            for r in filtered)
    assert {r.sample_id for r in select(records.values(), step=2)} == {s for s, (v, _) in trained.items() if v == 1}
    assert [r.sample_id for r in select(records.values(), where=["judge_a.score<2", "status==trained"])] == \
        sorted(s for s in trained if s + 0.25 < 2)


def test_a_worker_file_stops_at_its_size_and_a_torn_last_line_is_skipped(tmp_path):
    import torch

    from areal.graph.batch import Batch

    log = SampleLog(tmp_path, "score[0]", RecordsConfig(max_mb=0.001, max_chars=5))
    batch = Batch({"sample_id": torch.arange(100), "group_id": torch.zeros(100, dtype=torch.int64)})
    log.outputs("score", batch, {"text": ["abcdefghij"] * 100})
    log.close()
    lines = (tmp_path / "samples" / "score-0.jsonl").read_text().splitlines()
    assert json.loads(lines[-1]) == {"truncated": "records.max_mb=0.001 reached"}
    assert sum(len(x) + 1 for x in lines[:-1]) <= 0.001 * 2**20
    assert json.loads(lines[0])["outputs"]["text"] == "abcde… (10 chars)"
    with (tmp_path / "samples" / "score-0.jsonl").open("a") as f:
        f.write('{"sample_id": 99, "node": "sco')  # a kill mid-line
    assert len(read_samples(tmp_path)) == len(lines) - 1


def test_a_bad_condition_says_what_is_expected(tmp_path):
    with pytest.raises(ConfigError, match="expected FIELD OP VALUE"):
        select([], where=["reward"])
    with pytest.raises(ConfigError, match=r"no samples/ folder, .*\(written by runs with records.samples=true"):
        read_samples(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"records": {"samples": False}}))
    with pytest.raises(ConfigError, match=r"no samples/ folder, .*\(the run was made with records.samples=false"):
        read_samples(tmp_path)


def test_a_condition_on_a_field_no_sample_has_or_a_port_two_nodes_have_is_refused_not_an_empty_match():
    from areal.runtime.records.sample_records import SampleRecord

    records = [SampleRecord(i, lag=i % 2, fields={"judge_a.score": i, "judge_b.score": -i, "rollout.prompt": f"p{i}"})
               for i in range(4)]
    with pytest.raises(ConfigError, match=r"no sample has a field 'scor' \(they have: .*judge_a\.score.*lag"):
        select(records, where=["scor<1"])
    with pytest.raises(ConfigError, match=r"2 nodes have a port 'score' \(judge_a\.score, judge_b\.score\): name one"):
        select(records, where=["score<1"])
    assert [r.sample_id for r in select(records, where=["judge_b.score<-1", "prompt~p"])] == [2, 3]
    assert [r.sample_id for r in select(records, where=["lag==1"])] == [1, 3]
    assert select([], where=["anything<1"]) == []  # nothing recorded yet: nothing to name


def test_trained_lines_give_each_rows_runs_and_oldest_version_as_the_rows_themselves_say(tmp_path):
    import torch

    from areal.graph.batch import Ragged

    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, 6, (int(n),), generator=g).sort().values for n in torch.randint(0, 9, (40,), generator=g)]
    rows[1] = torch.tensor([4, 4, 5, 4])  # a value that comes back starts a new run
    rows[2] = rows[1].clone()  # a row that begins with its predecessor's last value still starts a run
    masks = [(torch.rand(len(r), generator=g) < 0.7).to(torch.int32) for r in rows]
    log = SampleLog(tmp_path, "actor[0]", RecordsConfig())
    log.trained("actor", 9, list(range(100, 140)), Ragged.from_rows(rows, torch.int32), Ragged.from_rows(masks))
    log.trained("actor", 10, [7], None, None)
    log.close()
    lines = [json.loads(x) for x in (tmp_path / "samples" / "actor-0.jsonl").read_text().splitlines()]

    def runs(row: torch.Tensor) -> list[list[int]]:  # the reference: each row on its own
        values, counts = torch.unique_consecutive(row, return_counts=True)
        return [[int(v), int(c)] for v, c in zip(values, counts, strict=True)]

    for line, sid, row, mask in zip(lines[:40], range(100, 140), rows, masks, strict=True):
        oldest = int(row.min()) if len(row) else 8
        assert line == {"sample_id": sid, "node": "actor", "status": "trained", "step": 9,
                        "version": oldest, "lag": 8 - oldest, "versions": runs(row), "loss_mask": runs(mask)}
    assert lines[2]["versions"] == [[4, 2], [5, 1], [4, 1]]
    assert lines[40] == {"sample_id": 7, "node": "actor", "status": "trained", "step": 10, "version": 9, "lag": 0}

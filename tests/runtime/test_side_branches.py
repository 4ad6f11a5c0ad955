"""A side branch (a node whose outputs no trainer reads) is part of the run: a sample it fails is failed, never
trained, and counted failed in the summary, the metrics and `areal samples` alike."""

from __future__ import annotations

import json
from pathlib import Path

from areal.cli.run import build_controller
from areal.runtime.records.sample_records import read_samples

RECIPE = Path(__file__).with_name("fake_rl.py")
AUDIT = """

@node(inputs={"advantage": Float["S"], "sample_id": Int["S"]}, outputs={"audited": Float["S"]})
def audit(batch):
    from areal.graph.roles import FAILED
    failed = {row: "audit: refused" for row, sid in enumerate(batch["sample_id"].tolist()) if sid % 4 == 1}
    return {"audited": batch["advantage"], FAILED: failed}


g.add(audit, pool=1)
"""


def test_a_row_a_side_branch_fails_is_never_trained_and_is_counted_failed_everywhere(tmp_path):
    recipe = tmp_path / "fake_rl.py"
    recipe.write_text(RECIPE.read_text() + AUDIT)
    controller = build_controller(recipe, ["steps=4"], tmp_path / "run")
    assert any((c.src, c.dst, c.fields) == ("audit", "actor", ()) for c in controller.plan.channels)
    state = controller.run()
    assert state.version == 4
    trained = {sid for line in (tmp_path / "run" / "trained.jsonl").read_text().splitlines()
               for sid in json.loads(line)["sample_ids"]}
    refused = {sid for sid in range(controller.accounting.started) if sid % 4 == 1}
    assert trained and not trained & refused  # every step trained, none of what the audit refused
    assert set(controller.accounting.failed) <= refused
    consumed_refused = {sid for g in controller.accounting.consumed for sid in controller.accounting.samples_of(g)
                        if sid in refused}
    assert consumed_refused and consumed_refused <= set(controller.accounting.failed)
    failed_lines = {json.loads(line)["sample_id"] for line in (tmp_path / "run" / "metrics.jsonl").read_text()
                    .splitlines() if json.loads(line).get("kind") == "failed"}
    records = read_samples(tmp_path / "run")
    listed = {sid for sid, r in records.items() if r.status == "failed"}
    assert failed_lines == listed == set(controller.accounting.failed)
    assert controller.accounting.summary()["failed"] == len(listed)
    assert {(records[sid].node, records[sid].reason) for sid in listed} == {("audit", "audit: refused")}


def test_a_side_branch_that_fails_every_row_of_a_group_frees_its_slot_and_the_run_goes_on(tmp_path):
    recipe = tmp_path / "fake_rl.py"
    recipe.write_text(RECIPE.read_text() + AUDIT.replace("sid % 4 == 1", "sid // 3 % 2 == 1"))  # every odd group
    controller = build_controller(recipe, ["steps=3"], tmp_path / "run")
    state = controller.run()
    assert state.version == 3
    summary = controller.accounting.summary()
    assert summary["trained"] == 3 * 2 * 3  # every step trained B whole groups: the lost ones were replaced
    assert all(sid // 3 % 2 == 0 for sid in controller.accounting.trained)
    assert controller.accounting.lost and all(g % 2 == 1 for g in controller.accounting.lost)


def test_a_side_branch_is_said_at_start_with_the_port_a_misnamed_output_was_likely_meant_for(tmp_path):
    from areal.graph.recipe import load_recipe
    from areal.runtime.compiler.compile import compile_plan, side_branch_notes

    recipe = tmp_path / "fake_rl.py"
    recipe.write_text(RECIPE.read_text() + AUDIT.replace('"audited"', '"advantages"'))
    loaded = load_recipe(recipe, [])
    (note,) = side_branch_notes(loaded.graph, compile_plan(loaded.graph, loaded.config, run_dir=tmp_path / "run"))
    assert note.endswith("node 'audit' (custom): a side branch: no node reads its output 'advantages'; the trainer "
                         "waits for its verdict on each group, and a sample it fails is not trained; did you mean "
                         "'advantage' for 'advantages'?")

"""A recipe imports the modules beside it, as `python recipe.py` would: in the controller and in every worker that
runs a node declared there."""

from __future__ import annotations

from pathlib import Path

from areal.cli.run import build_controller
from areal.runtime.records.sample_records import read_samples

RECIPE = Path(__file__).with_name("fake_rl.py")
NODES = '''
from areal import Float, Int, node
from areal.graph.roles import FAILED

REASON = "beside_the_recipe: refused"


@node(inputs={"advantage": Float["S"], "sample_id": Int["S"]}, outputs={"audited": Float["S"]})
def audit(batch):
    failed = {row: REASON for row, sid in enumerate(batch["sample_id"].tolist()) if sid % 4 == 1}
    return {"audited": batch["advantage"], FAILED: failed}
'''


def test_a_node_from_a_module_beside_the_recipe_runs_in_its_worker(tmp_path):
    (tmp_path / "beside_the_recipe.py").write_text(NODES)
    recipe = tmp_path / "fake_rl.py"
    recipe.write_text(RECIPE.read_text() + "\nfrom beside_the_recipe import audit\n\ng.add(audit, pool=1)\n")
    controller = build_controller(recipe, ["steps=2"], tmp_path / "run")
    assert controller.plan.pool_of("audit").role != "source"  # a worker process runs it, not the controller
    assert controller.run().version == 2
    reasons = {(r.node, r.reason) for r in read_samples(tmp_path / "run").values() if r.status == "failed"}
    assert reasons == {("audit", "beside_the_recipe: refused")}

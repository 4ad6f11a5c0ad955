from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console

from areal.config import RunConfig
from areal.graph import Float, Graph, Int, Json, node, viz
from areal.graph.picture import PlanView
from areal.graph.recipe import load_recipe
from areal.nodes import compute_logprob, generate, ppo_update
from areal.runtime.compiler.compile import compile_plan

SVG = "{http://www.w3.org/2000/svg}"
ROOT = Path(__file__).resolve().parents[2]


def _rl_graph(second_model: str = "") -> Graph:
    """The RL loop; with `second_model`, a second trainer of that name with its own proximal pass."""

    @node(inputs={"completion": Json["S"]}, outputs={"reward": Float["S"]})
    def score(batch):
        return {}

    @node(inputs={"reward": Float["S"], "group_id": Int["S"]}, outputs={"advantage": Float["S"]})
    def adv(batch):
        return {}

    g = Graph("rl")
    g.source("tasks", [], outputs={"prompt": Json["S"]})
    g.add(generate("rollout", model="actor" if second_model else None), pool=2)
    g.add(score)
    g.add(adv)
    g.add(compute_logprob("prox", model="actor" if second_model else None))
    g.add(ppo_update("actor"))
    if second_model:
        g.add(compute_logprob(f"prox_{second_model}", model=second_model, output="prox_b_logp"))
        g.add(ppo_update(second_model), take={"prox_logp": f"prox_{second_model}.prox_b_logp"})
    return g.validate()


def _texts(root: ET.Element) -> str:
    return " ".join("".join(t.itertext()) for t in root.iter(f"{SVG}text"))


@pytest.mark.parametrize("use_dot", [True, False])
def test_svg_is_valid_and_shows_nodes_ports_pools_and_weights(use_dot, monkeypatch):
    if use_dot and shutil.which("dot") is None:
        pytest.skip("graphviz 'dot' is not installed")
    if not use_dot:
        monkeypatch.setattr(viz.shutil, "which", lambda _: None)
    root = ET.fromstring(viz.to_svg(_rl_graph()))
    assert root.tag == f"{SVG}svg"
    text = _texts(root)
    for label in ("rollout", "(generate)", "×2", "actor", "(ppo-update)", "output_ids", "advantage", "weights"):
        assert label in text, label
    dashed = [e for e in root.iter() if "stroke-dasharray" in e.attrib or e.attrib.get("stroke-dasharray")]
    assert dashed, "the weight route is drawn dashed"


def test_dot_marks_control_edges_dashed_and_labels_data_edges():
    dot = viz.to_dot(_rl_graph())
    assert re.search(r'"actor" -> "rollout" \[id="weights:actor:rollout".*label=<weights>, style=dashed', dot)
    assert re.search(r'"actor" -> "prox" \[id="weights:actor:prox".*label=<weights>, style=dashed', dot)
    assert re.search(r'"score" -> "adv" \[id="data:score:adv".*label=<reward>', dot)


def test_html_embeds_the_svg_and_a_legend():
    page = viz.to_html(_rl_graph())
    assert page.startswith("<!doctype html>") and "<svg" in page and "ppo-update</span>" in page
    ET.fromstring(page[page.index("<svg"): page.index("</svg>") + 6])


def test_terminal_tree_lists_producers_and_weight_route():
    console = Console(width=120, record=True)
    console.print(viz.terminal_tree(_rl_graph()))
    out = console.export_text()
    assert "in  reward: float32[S]  ← score.reward" in out
    assert "weights ⇠ actor (control edge)" in out
    heads = [line.split()[1] for line in out.splitlines() if line.startswith(("├── ", "└── "))]
    assert heads == ["tasks", "rollout", "score", "adv", "prox", "actor"]


def _as_it_runs(graph: Graph, config: RunConfig) -> PlanView:
    return compile_plan(graph, config).view(graph)


def _kl_recipe():
    loaded = load_recipe(ROOT / "recipes" / "kl_rl.py")
    return loaded.graph, _as_it_runs(loaded.graph, loaded.config)


def _frames(svg: str) -> dict[str, tuple[float, float]]:
    """Each pool's frame in the built-in layout: (x, y) of its top-left corner."""
    root = ET.fromstring(svg)
    frames = {}
    for g in root.iter(f"{SVG}g"):
        if g.get("class") == "pool":
            rect = g.find(f"{SVG}rect")
            frames[g.get("id").removeprefix("pool-")] = (float(rect.get("x")), float(rect.get("y")))
    return frames


def test_the_built_in_layout_frames_each_pool_and_puts_parallel_branches_side_by_side(monkeypatch):
    monkeypatch.setattr(viz.shutil, "which", lambda _: None)
    graph, view = _kl_recipe()
    svg = viz.to_svg(graph, view)
    frames = _frames(svg)
    assert set(frames) == {"tasks", "rollout", "score", "reference", "kl_advantage", "actor"}
    (score_x, score_y), (ref_x, ref_y) = frames["score"], frames["reference"]
    assert score_y == ref_y and score_x != ref_x  # the two branches in one layer, side by side
    assert frames["kl_advantage"][1] > score_y and frames["actor"][1] > frames["kl_advantage"][1]  # the join below
    root = ET.fromstring(svg)
    edges = {g.get("id"): g.get("class") for g in root.iter(f"{SVG}g") if (g.get("class") or "").startswith("edge")}
    assert edges["channel:tasks:rollout"] == "edge channel gated"
    assert {"channel:score:kl_advantage", "channel:reference:kl_advantage", "weights:actor:rollout"} <= set(edges)
    assert "weights:actor:reference" not in edges  # a frozen reference takes no weights
    bounds = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "bound"]
    gate = "η=2 (async, strict): ≤ 2 versions ahead; every trained sample ≤ 2 versions behind"
    assert gate in bounds and "η=2 (async): ≤ 2 versions behind" in bounds


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz 'dot' is not installed")
def test_dot_draws_the_same_pools_channels_and_bounds():
    graph, view = _kl_recipe()
    dot = viz.to_dot(graph, view)
    clusters = re.findall(r'subgraph cluster_\d+ { id="pool-(\w+)"', dot)
    assert sorted(clusters) == sorted(["tasks", "rollout", "score", "reference", "kl_advantage", "actor"])
    assert 'id="channel:tasks:rollout", class="channel gated"' in dot
    assert dot.count("η=2 (async)") == 2
    ET.fromstring(viz.to_svg(graph, view))  # and dot renders it


def test_each_models_weights_route_is_drawn_with_its_bound(monkeypatch):
    monkeypatch.setattr(viz.shutil, "which", lambda _: None)
    graph = _rl_graph(second_model="critic")
    view = _as_it_runs(graph, RunConfig(model="builtin:tiny-coder", staleness=3))
    assert {(r.src, r.dst): r.bound for r in view.routes} == {
        ("actor", "rollout"): "η=3 (async): ≤ 3 versions behind",
        ("actor", "prox"): "same process: current weights",
        ("critic", "prox_critic"): "same process: current weights",
    }
    root = ET.fromstring(viz.to_svg(graph, view))
    edges = {g.get("id") for g in root.iter(f"{SVG}g") if (g.get("class") or "") == "edge weights"}
    assert edges == {"weights:actor:rollout", "weights:actor:prox", "weights:critic:prox_critic"}


@pytest.mark.parametrize(("mode", "eta", "gate"), [
    ("sync", 2, "η=0 (sync): waits for training"),
    ("lagged", 2, "η=2 (lagged): exactly 2 versions behind"),
    ("lagged", 1, "η=1 (lagged): exactly 1 version behind"),
    ("async", 1, "η=1 (async, strict): ≤ 1 version ahead; every trained sample ≤ 1 version behind"),
])
def test_the_bounds_say_what_the_mode_promises(mode, eta, gate):
    loaded = load_recipe(ROOT / "recipes" / "code_rl.py", overrides=[f"mode={mode}", f"staleness={eta}"])
    view = _as_it_runs(loaded.graph, loaded.config)
    labels = {c.bound for c in view.channels if c.bound} | {r.bound for r in view.routes}
    assert gate in labels


def test_terminal_tree_names_each_nodes_pool_and_the_gate():
    graph, view = _kl_recipe()
    console = Console(width=160, record=True)
    console.print(viz.terminal_tree(graph, view))
    out = console.export_text()
    assert "(7 nodes in 6 pools)" in out
    assert "reference (compute-logprob) in pool reference" in out
    assert "gate ⇠ tasks (η=2 (async, strict): ≤ 2 versions ahead; every trained sample ≤ 2 versions behind)" in out
    assert "weights ⇠ actor (η=2 (async): ≤ 2 versions behind)" in out


def _view_box(root: ET.Element) -> tuple[float, float, float, float]:
    x, y, w, h = map(float, root.get("viewBox").split())
    return x, y, x + w, y + h


def test_every_label_lies_inside_the_picture_and_bold_text_inside_its_shape(monkeypatch):
    """Measured with the layout's own (wide) estimate: a label on a left lane or a weights pill on the right edge
    is inside the canvas, and bold text in a pill or a box is squeezed to its shape when it might spill."""
    from areal.graph.layout import BOX_W
    from areal.graph.text_width import text_width

    monkeypatch.setattr(viz.shutil, "which", lambda _: None)
    graph, view = _kl_recipe()
    root = ET.fromstring(viz.to_svg(graph, view))
    x0, _, x1, _ = _view_box(root)
    for text in root.iter(f"{SVG}text"):
        width = float(text.get("textLength") or text_width(text.text or "", text.get("font-weight") == "bold"))
        left = float(text.get("x")) - {"end": width, "middle": width / 2}.get(text.get("text-anchor"), 0.0)
        assert x0 <= left and left + width <= x1, text.text
    for label in (g for g in root.iter(f"{SVG}g") if g.get("class") == "label"):
        for pill, text in zip(label.iter(f"{SVG}rect"), (t for t in label.iter(f"{SVG}text")
                                                         if t.get("class") == "bound"), strict=True):
            assert float(text.get("textLength")) <= float(pill.get("width")) - 12 + 1e-6
    long_name = "a_node_with_a_name_far_longer_than_its_box"
    assert text_width(long_name, bold=True) > BOX_W
    from areal.graph.layout import layered_svg
    from areal.graph.picture import Box, Cluster, Picture

    pic = Picture("long", {long_name: Box(long_name, "custom", "(custom)")},
                  (Cluster(long_name, "", (long_name,), framed=False),), ())
    drawn = ET.fromstring(layered_svg(pic))
    name = next(t for t in drawn.iter(f"{SVG}text") if t.text == long_name)
    assert float(name.get("textLength")) <= BOX_W - 12


def test_a_frozen_reference_is_drawn_as_a_fixed_second_model(monkeypatch):
    monkeypatch.setattr(viz.shutil, "which", lambda _: None)
    graph, view = _kl_recipe()
    root = ET.fromstring(viz.to_svg(graph, view))
    boxes = {g.get("id"): g for g in root.iter(f"{SVG}g") if (g.get("class") or "").startswith("node")}
    assert boxes["node-reference"].get("class") == "node frozen"
    assert "(frozen: the policy)" in _texts(boxes["node-reference"])
    assert boxes["node-proximal"].get("class") == "node"  # the trainer's own proximal pass is not frozen
    assert 'style="filled,dashed"' in viz.to_dot(graph, view).split('"reference" [')[1].split("];")[0]

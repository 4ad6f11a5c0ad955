from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET

import pytest
from rich.console import Console

from areal.graph import Float, Graph, Int, Json, node, viz
from areal.nodes import compute_logprob, generate, ppo_update

SVG = "{http://www.w3.org/2000/svg}"


def _rl_graph() -> Graph:
    @node(inputs={"completion": Json["S"]}, outputs={"reward": Float["S"]})
    def score(batch):
        return {}

    @node(inputs={"reward": Float["S"], "group_id": Int["S"]}, outputs={"advantage": Float["S"]})
    def adv(batch):
        return {}

    g = Graph("rl")
    g.source("tasks", [], outputs={"prompt": Json["S"]})
    g.add(generate("rollout"), pool=2)
    g.add(score)
    g.add(adv)
    g.add(compute_logprob("prox"))
    g.add(ppo_update("actor"))
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
    assert '"actor" -> "rollout" [label="weights", style=dashed' in dot
    assert '"actor" -> "prox" [label="weights", style=dashed' in dot
    assert '"score" -> "adv" [label="reward"]' in dot


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

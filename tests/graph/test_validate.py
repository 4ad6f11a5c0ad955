from __future__ import annotations

import pytest

from areal.errors import GraphError
from areal.graph import Float, Graph, Int, Json, node
from areal.graph.recipe import load_recipe
from areal.nodes import compute_logprob, generate, ppo_update
from tests.graph import recipes


def _problems(write_recipe, text: str) -> list[str]:
    with pytest.raises(GraphError) as caught:
        load_recipe(write_recipe(text))
    return caught.value.problems


def test_valid_recipe_derives_edges_by_port_name(write_recipe):
    loaded = load_recipe(write_recipe(recipes.GOOD))
    edges = {(e.src, e.dst_port, e.dst) for e in loaded.graph.edges()}
    assert edges == {("tasks", "prompt", "gen"), ("gen", "output_ids", "score"), ("score", "reward", "adv")}
    assert [n.name for n in loaded.graph.topological()] == ["tasks", "gen", "score", "adv"]


def test_missing_input_names_node_port_and_line(write_recipe):
    [problem] = _problems(write_recipe, recipes.MISSING_PRODUCER)
    assert problem.startswith("x.py:32: node 'score' (custom): input port 'output_ids' is produced by no node")
    assert "prompt, sample_id, group_id (from 'tasks')" in problem


def test_type_mismatch_shows_both_sides(write_recipe):
    [problem] = _problems(write_recipe, recipes.TYPE_MISMATCH)
    assert problem == (
        "x.py:34: node 'token_adv' (custom): 'score'.reward is float32[S]; "
        "'token_adv' expects float32[S,T] on 'reward'"
    )


def test_cycle_is_printed_as_its_path_with_lines(write_recipe):
    problems = _problems(write_recipe, recipes.CYCLE)
    cycles = [p for p in problems if p.startswith("cycle:")]
    assert len(cycles) == 1
    assert cycles[0].startswith("cycle: adv -> feedback -> adv (x.py:32, x.py:33)") or cycles[0].startswith(
        "cycle: feedback -> adv -> feedback (x.py:33, x.py:32)"
    )


def test_two_producers_names_both_and_suggests_take(write_recipe):
    [problem] = _problems(write_recipe, recipes.TWO_PRODUCERS)
    assert problem.startswith("x.py:35: node 'adv' (custom): input port 'reward' is produced by 2 nodes: ")
    assert "'score' (x.py:33), 'score2' (x.py:34)" in problem
    assert "take={'reward': 'score'}" in problem


def test_take_resolves_an_ambiguous_input(write_recipe):
    text = recipes.TWO_PRODUCERS.replace("g.add(adv)", "g.add(adv, take={'reward': 'score2'})")
    loaded = load_recipe(write_recipe(text))
    assert ("score2", "adv") in {(e.src, e.dst) for e in loaded.graph.edges()}


def test_duplicate_name_points_at_both_lines(write_recipe):
    [problem] = _problems(write_recipe, recipes.DUPLICATE)
    assert problem == (
        "x.py:33: node name 'gen' is already used by x.py:32: node 'gen' (custom); give one of them another name"
    )


def test_all_problems_are_reported_at_once(write_recipe):
    text = recipes.HEADER + "g = Graph('many')\ng.add(score)\ng.add(token_adv)\n"
    problems = _problems(write_recipe, text)
    assert any("has no source" in p for p in problems)
    assert any("'score' (custom): input port 'output_ids'" in p for p in problems)
    assert any("'token_adv' (custom)" in p and "'reward'" in p for p in problems)


def test_kind_missing_a_required_port_is_named():
    @node(inputs={"prompt": Json["S"]}, outputs={"output_ids": Int["S", "T"]}, kind="generate")
    def fake_generate(batch):
        return {}

    g = Graph("kinds")
    g.source("tasks", [], outputs={"prompt": Json["S"]})
    g.add(fake_generate)
    with pytest.raises(GraphError) as caught:
        g.validate()
    ports = [p for p in caught.value.problems if "output port " in p]
    missing = sorted(p.split("output port ")[1].split(";")[0] for p in ports)
    assert missing == ["'behav_logp'", "'prompt_ids'", "'versions'"]
    assert all("test_validate.py:" in p and "node 'fake_generate' (generate)" in p for p in caught.value.problems)


def test_generate_naming_an_unknown_model_is_an_error():
    @node(inputs={"reward": Float["S"]}, outputs={"advantage": Float["S"]})
    def adv(batch):
        return {}

    g = Graph("models")
    g.source("tasks", [], outputs={"prompt": Json["S"], "tests": Json["S"]})
    g.add(generate("rollout", model="critic"))
    with pytest.raises(GraphError) as caught:
        g.validate()
    assert any("model='critic' is no ppo-update node (ppo-update nodes: none)" in p for p in caught.value.problems)


def test_control_edges_route_weights_from_trainer_to_policies():
    @node(inputs={"output_ids": Int["S", "T"]}, outputs={"advantage": Float["S"]})
    def adv(batch):
        return {}

    g = Graph("rl")
    g.source("tasks", [], outputs={"prompt": Json["S"]})
    g.add(generate("rollout"))
    g.add(adv)
    g.add(compute_logprob("prox"))
    g.add(ppo_update("actor"))
    g.validate()
    assert {(c.src, c.dst) for c in g.control_edges()} == {("actor", "rollout"), ("actor", "prox")}
    # weights go back on control edges only: the data graph stays acyclic
    assert all(e.dst != "rollout" or e.src == "tasks" for e in g.edges())


def test_non_node_passed_to_add_says_how_to_fix():
    def plain(batch):
        return {}

    with pytest.raises(TypeError, match=r"decorate the function with @node"):
        Graph("x").add(plain)  # type: ignore[arg-type]


def test_an_optional_input_is_bound_only_when_the_graph_produces_it():
    from areal.config import RunConfig
    from areal.nodes import episode, generate, ppo_update
    from areal.runtime.compiler.compile import compile_plan

    async def agent(task, llm):
        return 1.0

    @node(inputs={"reward": Float["S"]}, outputs={"advantage": Float["S"]})
    def advantage(batch):
        return {}

    @node(inputs={"prompt_ids": Int["S", "T"], "output_ids": Int["S", "T"]}, outputs={"prox_logp": Float["S", "T"]})
    def proximal(batch):
        return {}

    bound = []
    for sampler, score in ((generate("rollout"), True), (episode("rollout", agent), False)):
        g = Graph("optional")
        g.source("tasks", [], outputs={"prompt": Json["S"]})
        g.add(sampler)
        if score:
            g.add(node(inputs={"completion": Json["S"]}, outputs={"reward": Float["S"]})(lambda b: {}), name="score")
        g.add(advantage)
        g.add(proximal)
        g.add(ppo_update("actor"))
        plan = compile_plan(g.validate(), RunConfig())
        bound.append(plan.binding("actor").get("loss_mask"))
    assert bound == [None, "rollout.loss_mask"]

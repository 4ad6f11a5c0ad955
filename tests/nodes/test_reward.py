"""The reward node's input ports follow what its reward function asks for."""

from __future__ import annotations

import pytest

from areal import Graph, Int, Json
from areal.data import code_tasks, math_tasks
from areal.errors import GraphError
from areal.nodes import generate, reward
from areal.rewards import math_reward


def _ports(spec):
    return {name: str(port) for name, port in spec.inputs.items()}


def test_a_reward_with_input_names_declares_those_ports_else_the_code_ports():
    def code(programs, tests):
        return [0.0] * len(programs)

    class ById:
        input_names = ("completion", "sample_id", "difficulty")

    assert _ports(reward("score", math_reward())) == {"completion": str(Json["S"]), "answer": str(Json["S"])}
    assert _ports(reward("score", ById())) == {
        "completion": str(Json["S"]),
        "sample_id": str(Int["S"]),
        "difficulty": str(Json["S"]),
    }
    assert list(reward("score", code).inputs) == ["prompt", "completion", "tests"]


def test_a_function_names_its_fields_by_its_parameters_unless_it_asks_for_programs_and_tests():
    def judge(completion, answer, tolerance=0.0):
        return [0.0] * len(completion)

    assert list(reward("score", judge).inputs) == ["completion", "answer"]  # a default is a setting, not a field
    assert list(reward("score", lambda programs, tests: []).inputs) == ["prompt", "completion", "tests"]
    assert list(reward("score", lambda *outputs: []).inputs) == ["prompt", "completion", "tests"]  # names none
    g = Graph("math")
    g.source("tasks", math_tasks("train"))
    g.add(generate("rollout"))
    g.add(reward("score", judge))
    g.validate()  # a math source produces answer: the judge fits it as a math reward would


def test_the_math_reward_fits_a_math_source_and_not_a_code_source():
    g = Graph("math")
    g.source("tasks", math_tasks("train"))
    g.add(generate("rollout"))
    g.add(reward("score", math_reward()))
    g.validate()

    g = Graph("mixed")
    g.source("tasks", code_tasks("train"))
    g.add(generate("rollout"))
    g.add(reward("score", math_reward()))
    with pytest.raises(GraphError, match=r"node 'score' \(reward\): input port 'answer' is produced by no node"):
        g.validate()

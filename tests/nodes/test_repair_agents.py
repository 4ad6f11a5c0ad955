"""The code-repair agent written twice, in Python (`llm.generate`) and against the OpenAI endpoint with the
`openai` client, is one agent: on the same tasks and weights both record the same trajectories and rewards."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from areal.data import builtin_code_tasks
from areal.graph.roles import FAILED
from tests.nodes.episodes import group, run_all, runner_on

pytestmark = pytest.mark.agent
pytest.importorskip("openai")
pytest.importorskip("aiohttp")
RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def _recipe(name: str):
    spec = importlib.util.spec_from_file_location(name, RECIPES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_python_and_the_openai_repair_agents_record_the_same_episodes(tmp_path):
    tasks = builtin_code_tasks("test").tasks[:4]
    batches = {}
    for name, endpoint in (("code_repair", False), ("code_repair_openai", True)):
        recipe = _recipe(name)
        runner = runner_on(tmp_path, recipe.repair, endpoint=endpoint, generation={"max_new_tokens": 8, "stop": []})
        runner.submit(*group([t["prompt"] for t in tasks], samples=2, tests=[t["tests"] for t in tasks]))
        (batch, _), = run_all(runner)
        runner.close()
        assert batch[FAILED] == [None] * 8
        batches[name] = batch
    python, served = batches["code_repair"], batches["code_repair_openai"]
    assert python["turns"].max() > 1  # some episodes repaired, so the comparison covers feedback turns
    for field in ("prompt_ids", "output_ids", "loss_mask", "versions"):
        assert all(torch.equal(a, b) for a, b in zip(python[field].rows(), served[field].rows())), field
    for a, b in zip(python["behav_logp"].rows(), served["behav_logp"].rows()):  # batched with other turns: rounding
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
    assert torch.equal(python["reward"], served["reward"]) and torch.equal(python["turns"], served["turns"])
    assert any(0 in row.tolist() for row in python["loss_mask"].rows())  # the feedback was context, not trained

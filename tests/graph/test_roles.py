"""A node's role is a Protocol: what a custom node lacks for its role is named at its recipe line."""

from __future__ import annotations

import pytest

from areal.errors import GraphError
from areal.graph import Float, Graph, Int, Json, node
from areal.graph.roles import missing_methods


def _graph(*specs):
    g = Graph("roles")
    g.source("tasks", [], outputs={"prompt": Json["S"]})
    for spec in specs:
        g.add(spec)
    return g


def test_a_stream_node_without_step_is_named_with_what_it_lacks():
    @node(inputs={"prompt": Json["S"]}, outputs={"score": Float["S"]}, role="stream")
    class HalfAGenerator:
        def submit(self, batch, meta): ...

        def pending(self):
            return 0

    with pytest.raises(GraphError) as caught:
        _graph(HalfAGenerator).validate()
    (problem,) = caught.value.problems
    assert "test_roles.py:" in problem and "node 'HalfAGenerator' (custom): a stream node needs step(), " \
                                           "load_weights() (graph/roles.py)" in problem


def test_a_function_is_a_map_or_a_filter_but_never_a_stream_or_a_trainer():
    def f(batch):
        return {}

    assert missing_methods("map", f) == [] and missing_methods("filter", f) == []
    assert missing_methods("trainer", f) == ["empty_step", "policy_weights", "save_weights"]


def test_declared_roles_and_kind_roles():
    @node(inputs={"score": Float["S"], "group_id": Int["S"]}, outputs={}, role="filter")
    def keep_some(batch):
        return {}

    @node(inputs={"prompt": Json["S"]}, outputs={"score": Float["S"]})
    def score(batch):
        return {}

    assert (keep_some.role, score.role) == ("filter", "map")
    with pytest.raises(ValueError, match="unknown role 'sink'"):
        node(inputs={}, outputs={}, role="sink")(lambda b: {})


def test_an_episode_is_an_async_function_or_a_class_with_an_async_run_and_is_named_at_its_line():
    from areal.nodes import episode

    async def agent(task, llm):
        return 1.0

    class Agent:
        async def run(self, task, llm):
            return 1.0

    def blocking(task, llm):
        return 1.0

    class NoRun:
        def setup(self, context): ...

    assert [missing_methods("episode", t) for t in (agent, Agent, blocking, NoRun)] == [
        [], [], ["async run(task, llm)"], ["async run(task, llm)"]]
    assert episode("e", agent).role == "episode"
    with pytest.raises(GraphError) as caught:
        _graph(episode("e", blocking)).validate()
    (problem,) = caught.value.problems
    assert "test_roles.py:" in problem and "node 'e' (episode): an episode node needs async run(task, llm)" in problem


def test_a_node_the_runtime_could_not_make_or_call_is_named_at_its_line():
    from areal.graph.roles import call_problems

    async def centred(batch):
        return {}

    class AsyncCall:
        async def __call__(self, batch):
            return {}

    class NoContext:
        def setup(self):
            ...

        def __call__(self, batch):
            return {}

    class Fine:
        def setup(self, context):
            ...

        def __call__(self, batch):
            return {}

    class FineToo(Fine):
        def setup(self, *args):
            ...

    class NeedsArgs(Fine):
        def __init__(self, scale, shift=0.0):
            self.scale = scale

    async def agent(task, llm):  # an episode's run is awaited: fine
        return 1.0

    assert call_problems("map", centred) == call_problems("filter", AsyncCall) == [
        "is an async def, and a node is called as a plain function; make it a def (asyncio.run(...) inside it for "
        "what it awaits)"]
    assert call_problems("map", NoContext) == [
        "its setup(self) cannot take the worker's context; define setup(self, context)"]
    assert call_problems("map", NeedsArgs) == [
        "NeedsArgs(scale, shift=0.0) cannot be made without arguments, and each worker makes its node with none; give "
        "them defaults, or read settings in setup(context)"]
    assert call_problems("map", Fine) == call_problems("map", FineToo) == call_problems("episode", agent) == []
    spec = node(inputs={"prompt": Json["S"]}, outputs={"score": Float["S"]})(NoContext)
    with pytest.raises(GraphError) as caught:
        _graph(spec).validate()
    (problem,) = caught.value.problems
    assert "test_roles.py:" in problem and "node 'NoContext' (custom): its setup(self) cannot take" in problem

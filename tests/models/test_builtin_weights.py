"""The built-in models ship in the package: the same weights on every machine, the ones the hashes name."""

from __future__ import annotations

import pytest

from areal.models.builtin_weights import HASHES, WEIGHTS_FILE, digest, rebuild, shipped_dir
from areal.models.loading import BUILTINS
from areal.models.tiny import tiny_coder_config

SHAPE = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
         "intermediate_size", "max_position_embeddings", "tie_word_embeddings", "pad_token_id", "eos_token_id")


@pytest.mark.parametrize("name", BUILTINS)
def test_each_builtin_ships_the_weights_its_hash_names_in_the_tiny_coders_shape(name):
    folder = shipped_dir(name)
    assert digest(folder / WEIGHTS_FILE) == HASHES[name]
    assert (folder / WEIGHTS_FILE).stat().st_size < 4 << 20  # about 3 MB of float32
    from transformers import AutoConfig

    shipped = AutoConfig.from_pretrained(folder, local_files_only=True)
    for field in SHAPE:
        assert getattr(shipped, field) == getattr(tiny_coder_config(), field), field


@pytest.mark.slow  # a warm start of each built-in: about a minute each on 2 cores
@pytest.mark.parametrize("name", BUILTINS)
def test_a_rebuild_on_this_machine_reproduces_the_shipped_weights(name, tmp_path):
    assert digest(rebuild(name, tmp_path) / WEIGHTS_FILE) == HASHES[name]

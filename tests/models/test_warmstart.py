from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from areal.data.code_tasks import builtin_code_tasks
from areal.models import warmstart
from areal.models.tiny import build_tiny_coder, tiny_coder_config
from areal.models.tokenizer import CharTokenizer
from areal.models.warmstart import DONE_FILE, _batch, warm_start

SMALL = {"hidden_size": 32, "num_hidden_layers": 1, "intermediate_size": 64}


@pytest.fixture
def tasks():
    return builtin_code_tasks("train", n=4).tasks


@pytest.fixture
def trainings(monkeypatch):
    """Counts the real trainings, so reuse is asserted by count, not by timing."""
    calls = []
    real = warmstart._train_and_save

    def counted(*args):
        calls.append(args[2])
        real(*args)

    monkeypatch.setattr(warmstart, "_train_and_save", counted)
    return calls


def test_first_call_trains_and_writes_atomically_second_call_reuses(tmp_path, tasks, trainings):
    path = warm_start(tiny_coder_config(**SMALL), tasks, steps=3, seed=0, cache_dir=tmp_path)
    assert {p.name for p in path.iterdir()} >= {"model.safetensors", "config.json", "tokenizer_config.json", DONE_FILE}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, f"{path.name}.lock"])  # no temp dir left
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    again = warm_start(tiny_coder_config(**SMALL), tasks, steps=3, seed=0, cache_dir=tmp_path)
    assert again == path and trainings == [3]
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime
    other = warm_start(tiny_coder_config(**SMALL), tasks, steps=4, seed=0, cache_dir=tmp_path)
    assert other != path and trainings == [3, 4]


def test_a_failed_training_leaves_nothing_behind(tmp_path, tasks, monkeypatch):
    def broken(config, tasks, steps, seed, out):
        (out / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("killed")

    monkeypatch.setattr(warmstart, "_train_and_save", broken)
    with pytest.raises(RuntimeError, match="killed"):
        warm_start(tiny_coder_config(**SMALL), tasks, steps=3, seed=0, cache_dir=tmp_path)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_an_incomplete_directory_in_the_cache_is_rebuilt(tmp_path, tasks, trainings):
    config = tiny_coder_config(**SMALL)
    stale = tmp_path / warmstart.cache_key(config, tasks, 3, 0)
    stale.mkdir()
    (stale / "config.json").write_text("{}")
    path = warm_start(config, tasks, steps=3, seed=0, cache_dir=tmp_path)
    assert path == stale and trainings == [3] and (path / DONE_FILE).exists()


def test_loss_covers_the_solution_and_eos_only():
    ids, mask, labels = _batch([([1, 10, 11], [20, 2]), ([1, 10], [21, 22, 2])], pad_id=0)
    assert ids.tolist() == [[1, 10, 11, 20, 2], [1, 10, 21, 22, 2]]
    ids, mask, labels = _batch([([1, 10, 11], [20, 2]), ([1], [21, 2])], pad_id=0)
    assert ids.tolist() == [[1, 10, 11, 20, 2], [1, 21, 2, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert labels.tolist() == [[-100, -100, -100, 20, 2], [-100, 21, 2, -100, -100]]


def _solution_nll(model, task):
    tokenizer = CharTokenizer()
    pair = warmstart._encode_pairs(tokenizer, [task])
    ids, mask, labels = _batch(pair, tokenizer.pad_token_id)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, labels=labels).loss.item()


def test_warm_start_lowers_the_loss_of_solutions_from_its_initialisation(tmp_path):
    tasks = builtin_code_tasks("train", n=2).tasks
    config = tiny_coder_config(**SMALL)
    path = warm_start(config, tasks, steps=40, seed=0, cache_dir=tmp_path)
    trained = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    initial = build_tiny_coder(0, config)  # the weights the warm start began from
    for task in tasks:
        assert _solution_nll(trained, task) < 0.6 * _solution_nll(initial, task)

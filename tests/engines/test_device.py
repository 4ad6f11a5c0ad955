"""generation.device and trainer.device: "auto" runs where there is a GPU and on the CPU elsewhere, a GPU named
where there is none is refused before any model loads, and the engines put their models where they are told."""

from __future__ import annotations

import pytest
import torch

from areal.config import RunConfig
from areal.engines import engine_problems, train_engine
from areal.engines.device import device_problem, torch_device
from areal.engines.training.micro_batch import MicroBatch
from areal.engines.training.torch_train import TorchTrainEngine
from areal.errors import ConfigError
from areal.overrides import apply_overrides
from tests.engines.conftest import tiny_qwen2


def test_auto_is_the_gpu_when_torch_sees_one_else_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert torch_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert torch_device("auto") == torch.device("cuda")
    assert torch_device("cuda:1") == torch.device("cuda", 1) and torch_device("cpu") == torch.device("cpu")


def test_a_gpu_named_where_there_is_none_is_refused_with_the_way_out(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = apply_overrides(RunConfig(), ["generation.device=cuda", "trainer.device=cuda:0"])
    assert engine_problems(config) == [
        'generation.device="cuda" needs a CUDA GPU (this process sees none); generation.device="auto" uses the '
        "CPU here.",
        'trainer.device="cuda:0" needs a CUDA GPU (this process sees none); trainer.device="auto" uses the CPU here.',
    ]
    assert engine_problems(apply_overrides(RunConfig(), ["generation.device=cpu"])) == []
    # an emulated trainer holds no model, so it names no device it could lack
    emulated = apply_overrides(RunConfig(), ["trainer.engine=emulated", "trainer.device=cuda"])
    assert engine_problems(emulated, generation=False) == []


def test_a_gpu_index_past_the_ones_this_process_sees_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert device_problem("trainer.device", "cuda:1") is None
    assert device_problem("trainer.device", "cuda:2") == ('trainer.device="cuda:2": this process sees 2 CUDA GPU(s), '
                                                         "cuda:0 to cuda:1.")


def test_a_device_that_is_no_device_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"generation\.device: string should match pattern"):
        apply_overrides(RunConfig(), ["generation.device=gpu"])


def test_the_train_engine_moves_its_model_to_the_trainers_device():
    engine = train_engine(apply_overrides(RunConfig(), ["trainer.device=cpu"]), lambda: tiny_qwen2(0).double())
    assert isinstance(engine, TorchTrainEngine) and engine.device == torch.device("cpu")
    assert next(engine.model.parameters()).dtype == torch.float64


def test_per_token_spreads_a_per_sample_value_wherever_the_values_live():
    mb = MicroBatch(index=[0, 1], cu_seqlens=torch.tensor([0, 2, 5]), fields={}, batch_tokens=5)
    assert mb.per_token(torch.tensor([1.0, -2.0], dtype=torch.float64)).tolist() == [1.0, 1.0, -2.0, -2.0, -2.0]


def test_nccl_weights_on_one_machine_without_ray_are_refused_before_the_run():
    with pytest.raises(ConfigError, match=r"NCCL, which refuses two members on one GPU .*transport\.weights=files"):
        apply_overrides(RunConfig(), ["generation.engine=vllm", "transport.weights=broadcast"])
    ray = apply_overrides(RunConfig(), ["generation.engine=vllm", "transport.weights=broadcast",
                                        "cluster.backend=ray"])
    assert ray.transport.weights == "broadcast"

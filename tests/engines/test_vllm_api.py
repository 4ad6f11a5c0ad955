"""The list of vLLM calls the GPU suite checks against a real vLLM holds every call the backend makes (recorded
against a stand-in vLLM), the check finds a call a release does not take, and a release outside the checked range
is refused before any engine starts, naming the range and the installed version."""

from __future__ import annotations

import dataclasses
import sys
import types
from typing import Literal

import pytest
import torch

from areal import engines
from areal.config import RunConfig
from areal.engines.lora.slots import vllm_lora_args
from areal.engines.vllm.api import CALLS, SUPPORTED, Call, check, unsupported
from areal.engines.vllm.generate import Sampling, VLLMBackend


class _Recorder:
    """A stand-in for one vLLM class or function: records how it was called, answers with `result`."""

    def __init__(self, target: str, calls: list, result=None) -> None:
        self.target, self.calls, self.result = target, calls, result

    def __call__(self, *args, **kwargs):
        self.calls.append((self.target, len(args), tuple(sorted(kwargs))))
        return self.result() if callable(self.result) else self.result


def _stand_in(calls: list) -> types.ModuleType:
    out = types.SimpleNamespace(request_id="1.0", finished=True, outputs=[types.SimpleNamespace(
        token_ids=[5], logprobs=[{5: types.SimpleNamespace(logprob=-0.5)}])])
    engine = types.SimpleNamespace(**{name: _Recorder(f"LLMEngine.{name}", calls, result) for name, result in (
        ("add_request", None), ("abort_request", None), ("step", lambda: [out]), ("collective_rpc", None),
        ("reset_prefix_cache", True), ("add_lora", True), ("remove_lora", True))})
    vllm = types.ModuleType("vllm")
    vllm.EngineArgs = _Recorder("EngineArgs", calls, dict)
    vllm.SamplingParams = _Recorder("SamplingParams", calls, dict)
    vllm.LLMEngine = types.SimpleNamespace(from_engine_args=_Recorder("LLMEngine.from_engine_args", calls, engine))
    return vllm


def test_every_vllm_call_the_backend_makes_is_in_the_checked_list(monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "vllm", _stand_in(calls))
    monkeypatch.setitem(sys.modules, "vllm.sampling_params",
                        types.SimpleNamespace(RequestOutputKind=types.SimpleNamespace(DELTA="delta")))
    monkeypatch.setitem(sys.modules, "vllm.lora.request", types.SimpleNamespace(LoRARequest=_Recorder(
        "lora.request.LoRARequest", calls, dict)))
    backend = VLLMBackend("some/model")
    backend.add_request("1.0", [3, 4], 8, Sampling(1.0, 1.0, 7), resumed=False)
    backend.add_request("1.1", [3, 4, 5], 7, Sampling(1.0, 1.0, 8), resumed=True)
    assert [o.token_ids for o in backend.step()] == [[5]]
    backend.abort(["1.1"])
    backend.load_weights({"w": torch.ones(2)})
    backend.join_weight_group("127.0.0.1:1", 1, 2)
    backend.receive_weights()
    lora = VLLMBackend("some/model", **vllm_lora_args(8, 1))  # a LoRA policy's engine: an adapter per version
    lora.add_lora(1, "/adapters/v1")
    lora.add_request("2.0", [3, 4], 8, Sampling(1.0, 1.0, 9), resumed=False, lora_id=1)
    lora.remove_lora(1)
    declared = {(c.target, c.args, tuple(sorted(c.kwargs))) for c in CALLS}
    made = set(calls)
    assert made - declared == set()  # a call made and not in vllm.api.CALLS would go unchecked on a real vLLM
    assert {"EngineArgs", "LLMEngine.add_request", "LLMEngine.abort_request", "LLMEngine.step",
            "LLMEngine.collective_rpc", "LLMEngine.reset_prefix_cache", "SamplingParams", "LLMEngine.add_lora",
            "LLMEngine.remove_lora", "lora.request.LoRARequest"} <= {t for t, _, _ in made}


@dataclasses.dataclass
class _EngineArgs:  # a release whose engine knows no priority scheduling
    model: str = ""
    scheduling_policy: Literal["fcfs"] = "fcfs"


class _LLMEngine:
    @classmethod
    def from_engine_args(cls, engine_args):
        return cls()

    def add_request(self, request_id, prompt, params, arrival_time=None):  # no priority
        pass


def test_the_check_names_a_call_the_installed_release_does_not_take():
    vllm = types.ModuleType("stand_in_vllm")
    vllm.EngineArgs, vllm.LLMEngine = _EngineArgs, _LLMEngine
    calls = (Call("EngineArgs", kwargs=("model", "scheduling_policy"), values=(("scheduling_policy", "priority"),)),
             Call("LLMEngine.from_engine_args", args=1), Call("LLMEngine.add_request", args=3, kwargs=("priority",)),
             Call("LLMEngine.reset_prefix_cache"))
    rows = dict(check(vllm, calls, reads={}))
    assert rows["EngineArgs(model=, scheduling_policy=)"] == "scheduling_policy='priority' is not one of ('fcfs',)"
    assert rows["LLMEngine.from_engine_args(_)"] == "ok"
    assert rows["LLMEngine.add_request(_, _, _, priority=)"].startswith(
        "does not take the call: got an unexpected keyword argument 'priority'")
    assert rows["LLMEngine.reset_prefix_cache()"] == "AttributeError: type object '_LLMEngine' has no attribute " \
                                                     "'reset_prefix_cache'"


@pytest.mark.parametrize("version, refused", [(SUPPORTED[0], False), (SUPPORTED[1], False), ("0.20.2", False),
                                              ("0.33.0+cu130", False), ("0.10.2", True), ("0.34.0", True),
                                              ("1.0.0", True), ("nightly", True)])
def test_a_release_outside_the_checked_range_is_refused_naming_it_and_the_range(version, refused):
    said = unsupported(version)
    assert (said is not None) == refused
    if refused:
        assert said == (f'generation.engine="vllm": vLLM {version} is installed, but areal\'s vLLM backend is checked '
                        f"against vLLM {SUPPORTED[0]} to {SUPPORTED[1]} (pip install 'vllm>={SUPPORTED[0]},"
                        f"<={SUPPORTED[1]}'); generation.engine=\"torch\" runs without it.")


def test_a_run_on_an_unsupported_vllm_is_refused_before_any_engine_starts(monkeypatch):
    monkeypatch.setattr(engines, "_has_package", lambda name: True)
    monkeypatch.setattr(engines, "_has_cuda", lambda: True)
    monkeypatch.setattr(engines, "_package_version", lambda name: "0.35.1")
    config = RunConfig(generation={"engine": "vllm"})
    assert engines.engine_problems(config, training=False) == [unsupported("0.35.1")]
    monkeypatch.setattr(engines, "_package_version", lambda name: SUPPORTED[1])
    assert engines.engine_problems(config, training=False) == []

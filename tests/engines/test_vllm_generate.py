"""The vLLM engine's bookkeeping (abort, load in place, resubmit) against a deterministic fake backend."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from areal.engines.generation import GenRequest
from areal.engines.vllm.generate import MISSING_VLLM, BackendOutput, Sampling, VLLMBackend, VLLMGenerationEngine

VOCAB = 50
EOS = 0


def next_token(context: list[int], weight: int) -> int:
    """The fake model: the next token is a function of the whole context and the loaded weight (never EOS)."""
    return 1 + (sum(context) * 7 + len(context) * weight) % (VOCAB - 1)


def fake_logp(token: int, weight: int) -> float:
    return -0.01 * token - weight


class FakeBackend:
    """One token per running request per step; records every call so tests can check the protocol."""

    def __init__(self, weight: int = 1) -> None:
        self.weight = weight
        self.running: dict[str, tuple[list[int], int]] = {}  # id -> (context, tokens still allowed)
        self.calls: list[tuple] = []
        self.resumed: dict[str, bool] = {}  # id -> sent ahead of the requests not yet started
        self.late: list[BackendOutput] = []  # outputs to deliver at the next step (a stale one, in a test)
        self.loras: dict[int, int] = {}  # registered adapter id -> the weight it samples with
        self.lora_of: dict[str, int] = {}  # request id -> the adapter it was sent under

    def add_request(self, request_id, token_ids, max_tokens, sampling, resumed, lora_id=0):
        assert isinstance(sampling, Sampling)
        self.calls.append(("add", request_id, list(token_ids), max_tokens) + ((lora_id,) if lora_id else ()))
        self.resumed[request_id] = resumed
        self.running[request_id] = (list(token_ids), max_tokens)
        assert lora_id == 0 or lora_id in self.loras, f"request {request_id} under adapter {lora_id}, not registered"
        self.lora_of[request_id] = lora_id

    def add_lora(self, lora_id, path):  # the fake adapter moves the weight by its one B·A entry
        from safetensors.torch import load_file

        factors = load_file(f"{path}/adapter_model.safetensors")
        a, b = (t for k, t in sorted(factors.items()))  # lora_A then lora_B
        self.loras[lora_id] = self.weight + int((b @ a).item())
        self.calls.append(("add_lora", lora_id))

    def remove_lora(self, lora_id):
        del self.loras[lora_id]
        self.calls.append(("remove_lora", lora_id))

    def abort(self, request_ids):
        self.calls.append(("abort", sorted(request_ids)))
        for rid in request_ids:
            self.running.pop(rid)

    def load_weights(self, state_dict):
        self.calls.append(("load", int(state_dict["w"])))
        self.weight = int(state_dict["w"])

    def join_weight_group(self, rendezvous, member, size):
        self.calls.append(("join", rendezvous, member, size))

    def receive_weights(self):  # the weights group's next broadcast: here, the weight after the current one
        self.weight += 1
        self.calls.append(("receive", self.weight))

    def step(self):
        outs, self.late = list(self.late), []
        for rid, (context, left) in list(self.running.items()):
            weight = self.loras[self.lora_of[rid]] if self.lora_of.get(rid) else self.weight
            tok = next_token(context, weight)
            context.append(tok)
            done = left == 1
            self.running[rid] = (context, left - 1)
            if done:
                del self.running[rid]
            outs.append(BackendOutput(rid, [tok], [fake_logp(tok, weight)], finished=done))
        return outs


def reference(prompt: list[int], n: int, switch_at: int | None, w_old: int = 1, w_new: int = 2) -> list[int]:
    """What a model with w_old for the first switch_at tokens and w_new afterwards would produce."""
    context, out = list(prompt), []
    for i in range(n):
        tok = next_token(context, w_old if switch_at is None or i < switch_at else w_new)
        context.append(tok)
        out.append(tok)
    return out


def test_without_interruption_tokens_logprobs_and_versions_come_from_the_backend():
    engine = VLLMGenerationEngine(FakeBackend(), eos_token_id=EOS, max_new_tokens=5, version=3)
    (res,) = engine.generate([GenRequest(7, [4, 5, 6])])
    expected = reference([4, 5, 6], 5, None)
    assert res.request_id == 7 and res.finish_reason == "length"
    assert res.output_ids.tolist() == expected
    assert res.logprobs.tolist() == pytest.approx([fake_logp(t, 1) for t in expected])
    assert res.versions.tolist() == [3] * 5
    assert res.prompt_ids.tolist() == [4, 5, 6]


def test_interruption_mid_sequence_resubmits_with_tokens_so_far_and_keeps_old_versions():
    backend = FakeBackend()
    engine = VLLMGenerationEngine(backend, eos_token_id=EOS, max_new_tokens=6)
    engine.submit([GenRequest(1, [3, 1]), GenRequest(2, [9], max_new_tokens=4)])
    assert engine.step() == [] and engine.step() == []  # two tokens each with version 0
    engine.update_weights({"w": torch.tensor(2)}, version=1)
    done = {}
    while engine.pending():
        done |= {r.request_id: r for r in engine.step()}

    first, second = done[1], done[2]
    assert first.output_ids.tolist() == reference([3, 1], 6, switch_at=2)
    assert first.versions.tolist() == [0, 0, 1, 1, 1, 1]
    assert first.logprobs.tolist() == pytest.approx(
        [fake_logp(t, 1 if i < 2 else 2) for i, t in enumerate(first.output_ids.tolist())])
    assert second.output_ids.tolist() == reference([9], 4, switch_at=2)
    assert second.versions.tolist() == [0, 0, 1, 1]
    assert first.prompt_ids.tolist() == [3, 1]  # the original prompt, not the resubmitted context
    # the protocol: abort both attempts, load once (no new backend), resubmit prompt + 2 tokens for the rest
    out1, out2 = first.output_ids.tolist(), second.output_ids.tolist()
    assert backend.calls[:2] == [("add", "1.0", [3, 1], 6), ("add", "2.0", [9], 4)]
    assert backend.calls[2:6] == [
        ("abort", ["1.0", "2.0"]),
        ("load", 2),
        ("add", "1.1", [3, 1] + out1[:2], 4),
        ("add", "2.1", [9] + out2[:2], 2),
    ]
    assert backend.resumed == {"1.0": False, "2.0": False, "1.1": True, "2.1": True}  # resubmitted ahead of new ones
    assert engine.interruptions == 2 and engine.version == 1


def test_weights_received_over_the_group_interrupt_like_loaded_ones():
    backend = FakeBackend()
    engine = VLLMGenerationEngine(backend, eos_token_id=EOS, max_new_tokens=5)
    engine.join_weight_group("127.0.0.1:1234", 2, 3)
    engine.submit([GenRequest(6, [4])])
    engine.step()
    engine.receive_weights(version=1)  # the backend's worker takes part in the broadcast, then resubmits
    (res,) = engine.step() + engine.step() + engine.step() + engine.step()
    assert res.output_ids.tolist() == reference([4], 5, switch_at=1)
    assert res.versions.tolist() == [0, 1, 1, 1, 1]
    out = res.output_ids.tolist()
    assert backend.calls[:5] == [("join", "127.0.0.1:1234", 2, 3), ("add", "6.0", [4], 5), ("abort", ["6.0"]),
                                 ("receive", 2), ("add", "6.1", [4, out[0]], 4)]


def test_two_interruptions_record_three_versions():
    engine = VLLMGenerationEngine(FakeBackend(), eos_token_id=EOS, max_new_tokens=5)
    engine.submit([GenRequest(4, [2, 2])])
    engine.step()
    engine.update_weights({"w": torch.tensor(2)}, version=1)
    engine.step()
    engine.step()
    engine.update_weights({"w": torch.tensor(2)}, version=2)
    (res,) = engine.step() + engine.step()
    assert res.versions.tolist() == [0, 1, 1, 2, 2]
    assert res.output_ids.tolist() == reference([2, 2], 5, switch_at=1)


def test_a_late_output_of_an_aborted_attempt_is_dropped():
    backend = FakeBackend()
    engine = VLLMGenerationEngine(backend, eos_token_id=EOS, max_new_tokens=3)
    engine.submit([GenRequest(5, [1])])
    engine.step()
    engine.update_weights({"w": torch.tensor(2)}, version=1)
    backend.late = [BackendOutput("5.0", [33], [-9.0])]  # produced before the abort, delivered after it
    (res,) = engine.step() + engine.step()
    assert res.output_ids.tolist() == reference([1], 3, switch_at=1)
    assert res.versions.tolist() == [0, 1, 1]


def test_eos_and_stop_strings_end_a_request_and_abort_it_in_the_backend():
    backend = FakeBackend()
    first = reference([5], 3, None)
    engine = VLLMGenerationEngine(backend, eos_token_id=first[1], max_new_tokens=10)
    (res,) = engine.generate([GenRequest(0, [5])])
    assert res.finish_reason == "eos" and res.output_ids.tolist() == first[:2]
    assert ("abort", ["0.0"]) in backend.calls and not backend.running

    # a stop string that straddles an interruption: "ab" with "a" before the update and "b" after
    decode = {first[0]: "a", first[1]: "b"}.get
    engine = VLLMGenerationEngine(FakeBackend(), eos_token_id=EOS, max_new_tokens=10, stop_strings=["ab"],
                                  decode=lambda ids: "".join(decode(t) or "x" for t in ids))
    engine.submit([GenRequest(0, [5])])
    engine.step()
    engine.update_weights({"w": torch.tensor(1)}, version=1)  # same weights: the same next token
    (res,) = engine.step()
    assert res.finish_reason == "stop" and res.output_ids.tolist() == first[:2]
    assert res.versions.tolist() == [0, 1]


def test_bad_requests_are_refused_before_any_is_sent():
    backend = FakeBackend()
    engine = VLLMGenerationEngine(backend, eos_token_id=EOS)
    engine.submit([GenRequest(1, [1])])
    with pytest.raises(ValueError, match="request 1: this request_id is already in flight"):
        engine.submit([GenRequest(2, [1]), GenRequest(1, [2])])
    with pytest.raises(ValueError, match="request 3: empty prompt"):
        engine.submit([GenRequest(3, [])])
    assert [c[1] for c in backend.calls] == ["1.0"]


def test_missing_vllm_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    with pytest.raises(ImportError) as info:
        VLLMBackend("some/model")
    assert str(info.value) == MISSING_VLLM
    assert "pip install 'areal[gpu]'" in MISSING_VLLM and 'engine="torch"' in MISSING_VLLM


def test_an_aborted_request_leaves_the_backend_and_reports_the_tokens_it_had():
    backend = FakeBackend()
    engine = VLLMGenerationEngine(backend, eos_token_id=EOS, max_new_tokens=6, version=2)
    engine.submit([GenRequest(request_id=4, prompt_ids=[3, 4]), GenRequest(request_id=5, prompt_ids=[5])])
    engine.step()
    engine.step()
    assert engine.progress() == {4: (2, 2), 5: (2, 2)}
    assert engine.abort([5]) == {5: 2} and backend.calls[-1] == ("abort", ["5.0"])
    results = []
    while engine.pending():
        results += engine.step()
    assert [r.request_id for r in results] == [4] and results[0].output_ids.tolist() == reference([3, 4], 6, None)


def test_a_requeued_request_is_resubmitted_with_its_tokens_so_far_and_finishes_as_it_would_have():
    backend = FakeBackend()
    engine = VLLMGenerationEngine(backend, eos_token_id=EOS, max_new_tokens=6, version=2)
    engine.submit([GenRequest(request_id=4, prompt_ids=[3, 4])])
    engine.step()
    engine.step()
    so_far = reference([3, 4], 2, None)
    assert engine.requeue([4, 9]) == {4: 2}  # an unknown id is no-op
    assert backend.calls[-2:] == [("abort", ["4.0"]), ("add", "4.1", [3, 4, *so_far], 4)]
    assert backend.resumed == {"4.0": False, "4.1": True}  # resubmitted ahead of the requests not yet started
    results = []
    while engine.pending():
        results += engine.step()
    assert results[0].output_ids.tolist() == reference([3, 4], 6, None) and results[0].versions.tolist() == [2] * 6


def test_the_vllm_backend_schedules_by_priority_and_sends_a_resumed_request_first(monkeypatch):
    """What VLLMBackend asks of vLLM, against a stand-in module: priority scheduling, and a lower value (taken
    first) for a resubmitted request than for one not yet started."""
    made: dict = {}
    added: list[tuple[str, int]] = []

    class Engine:  # v1 LLMEngine.add_request's documented parameters, in their order
        def add_request(self, request_id, prompt, params, arrival_time=None, lora_request=None, trace_headers=None,
                        priority=0):
            added.append((request_id, priority))

    def engine_args(**kwargs):
        made.update(kwargs)
        return kwargs

    vllm = types.SimpleNamespace(EngineArgs=engine_args, SamplingParams=lambda **kw: kw,
                                 LLMEngine=types.SimpleNamespace(from_engine_args=lambda args: Engine()))
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params",
                        types.SimpleNamespace(RequestOutputKind=types.SimpleNamespace(DELTA="delta")))
    backend = VLLMBackend("some/model")
    sampling = Sampling(1.0, 1.0, 0)
    backend.add_request("1.0", [3], 4, sampling, resumed=False)
    backend.add_request("1.1", [3, 5], 3, sampling, resumed=True)
    assert made["scheduling_policy"] == "priority"
    assert added == [("1.0", 0), ("1.1", -1)]


def _adapter(delta: int) -> dict:
    """A LoRA adapter of one rank-1 factor pair whose B·A is `delta` (the fake backend adds it to its weight)."""
    return {"w.weight::lora_A": torch.tensor([[1.0]]), "w.weight::lora_B": torch.tensor([[float(delta)]])}


def test_each_lora_version_is_an_adapter_of_its_own_and_requests_in_flight_resume_under_it(tmp_path):
    from areal.engines.lora.slots import AdapterSlots

    backend = FakeBackend()
    engine = VLLMGenerationEngine(backend, eos_token_id=EOS, max_new_tokens=6,
                                  adapters=AdapterSlots(tmp_path, keep=2, base="the-base"))  # η = 1: 2 slots
    engine.submit([GenRequest(1, [3, 1])])
    engine.step(), engine.step()  # two tokens under the base (weight 1)
    engine.load_adapter(_adapter(1), version=1)  # weight 1 + 1
    engine.step()
    engine.load_adapter(_adapter(2), version=2)  # weight 1 + 2
    (res,) = engine.step() + engine.step() + engine.step()
    out = res.output_ids.tolist()
    context, expected = [3, 1], []
    for weight in (1, 1, 2, 3, 3, 3):
        expected.append(next_token(context + expected, weight))
    assert out == expected and res.versions.tolist() == [0, 0, 1, 2, 2, 2]
    assert res.logprobs.tolist() == pytest.approx([fake_logp(t, w) for t, w in zip(out, (1, 1, 2, 3, 3, 3))])
    # the base never changes: each version is registered (id version + 1), then the request resumes under it
    assert backend.calls == [
        ("add", "1.0", [3, 1], 6), ("abort", ["1.0"]), ("add_lora", 2), ("add", "1.1", [3, 1] + out[:2], 4, 2),
        ("abort", ["1.1"]), ("add_lora", 3), ("add", "1.2", [3, 1] + out[:3], 3, 3)]
    engine.load_adapter(_adapter(3), version=3)  # a third version: the oldest of the η + 1 kept goes
    assert backend.calls[-2:] == [("add_lora", 4), ("remove_lora", 2)] and set(backend.loras) == {3, 4}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v000002", "v000003"]


def test_an_adapter_to_an_engine_started_without_lora_is_refused():
    engine = VLLMGenerationEngine(FakeBackend(), eos_token_id=EOS)
    with pytest.raises(ValueError, match="started without LoRA"):
        engine.load_adapter(_adapter(1), version=1)


def test_the_engine_holds_eta_plus_one_adapters_at_the_smallest_rank_vllm_serves_above_the_policys():
    from areal.engines.lora.slots import vllm_lora_args

    assert vllm_lora_args(8, staleness=1) == {"enable_lora": True, "max_loras": 2, "max_cpu_loras": 2,
                                              "max_lora_rank": 8}
    assert vllm_lora_args(12, staleness=3)["max_lora_rank"] == 16 and vllm_lora_args(12, 3)["max_loras"] == 4
    with pytest.raises(ValueError, match="up to 512"):
        vllm_lora_args(600, staleness=1)


def test_the_vllm_backend_registers_each_adapter_as_a_lora_request_and_sends_requests_under_it(monkeypatch):
    """What VLLMBackend asks of vLLM for LoRA, against a stand-in of its documented API: EngineArgs(enable_lora,
    max_loras, max_cpu_loras, max_lora_rank), LoRARequest(lora_name, lora_int_id, lora_path), LLMEngine.add_lora /
    remove_lora, and add_request(..., lora_request=...)."""
    from dataclasses import dataclass

    from areal.engines.lora.slots import vllm_lora_args

    made: dict = {}
    log: list = []

    @dataclass(frozen=True)
    class LoRARequest:
        lora_name: str
        lora_int_id: int
        lora_path: str

    class Engine:
        def add_request(self, request_id, prompt, params, arrival_time=None, lora_request=None, trace_headers=None,
                        priority=0):
            log.append(("add", request_id, lora_request))

        def add_lora(self, lora_request) -> bool:
            assert lora_request.lora_int_id > 0  # vLLM's own check
            log.append(("add_lora", lora_request))
            return True

        def remove_lora(self, lora_id) -> bool:
            log.append(("remove_lora", lora_id))
            return True

    vllm = types.SimpleNamespace(EngineArgs=lambda **kwargs: made.update(kwargs) or kwargs,
                                 SamplingParams=lambda **kw: kw,
                                 LLMEngine=types.SimpleNamespace(from_engine_args=lambda args: Engine()))
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params",
                        types.SimpleNamespace(RequestOutputKind=types.SimpleNamespace(DELTA="delta")))
    monkeypatch.setitem(sys.modules, "vllm.lora", types.SimpleNamespace())
    monkeypatch.setitem(sys.modules, "vllm.lora.request", types.SimpleNamespace(LoRARequest=LoRARequest))
    backend = VLLMBackend("some/model", **vllm_lora_args(8, staleness=1))
    assert {k: made[k] for k in ("enable_lora", "max_loras", "max_cpu_loras", "max_lora_rank")} == {
        "enable_lora": True, "max_loras": 2, "max_cpu_loras": 2, "max_lora_rank": 8}
    backend.add_lora(2, "/adapters/v000001")
    backend.add_request("1.1", [3], 4, Sampling(1.0, 1.0, 0), resumed=True, lora_id=2)
    backend.add_request("2.0", [3], 4, Sampling(1.0, 1.0, 0), resumed=False)  # no adapter: the base
    backend.remove_lora(2)
    request = LoRARequest(lora_name="areal-2", lora_int_id=2, lora_path="/adapters/v000001")
    assert log == [("add_lora", request), ("add", "1.1", request), ("add", "2.0", None), ("remove_lora", 2)]

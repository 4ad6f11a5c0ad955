"""The vLLM engine's bookkeeping (abort, load in place, resubmit) against a deterministic fake backend."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from areal.engines.generation import GenRequest
from areal.engines.vllm_generate import MISSING_VLLM, BackendOutput, Sampling, VLLMBackend, VLLMGenerationEngine

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

    def add_request(self, request_id, token_ids, max_tokens, sampling, resumed):
        assert isinstance(sampling, Sampling)
        self.calls.append(("add", request_id, list(token_ids), max_tokens))
        self.resumed[request_id] = resumed
        self.running[request_id] = (list(token_ids), max_tokens)

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
            tok = next_token(context, self.weight)
            context.append(tok)
            done = left == 1
            self.running[rid] = (context, left - 1)
            if done:
                del self.running[rid]
            outs.append(BackendOutput(rid, [tok], [fake_logp(tok, self.weight)], finished=done))
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

    class Engine:
        def add_request(self, request_id, prompt, params, priority=0):
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

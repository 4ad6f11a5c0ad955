"""Interruptible generation on vLLM: abort, load new weights in place, resubmit with the tokens so far.

The one idea: vLLM cannot edit a running request's KV cache, but it can drop a request and take a
new one whose prompt already holds the tokens generated so far. So a weight update is

    abort every in-flight request -> load the new weights into the live engine (no restart)
    -> drop the prefix cache (its KV was computed with the old weights) -> resubmit each request
       as prompt + output so far, asking only for the tokens still allowed.

Tokens sampled before the update keep their version and behaviour logprob; tokens after it record
the new version. A resubmitted request (after an update, or re-queued by staleness_policy=recycle)
goes ahead of every request not yet started: vLLM's scheduler runs with `scheduling_policy=
"priority"` and takes it at a lower priority value, so a full queue neither swaps the running
requests out at every update nor keeps a re-queued group waiting while its tokens age. That
bookkeeping is `VLLMGenerationEngine`, pure Python over the small `Backend` Protocol, so it is tested
on CPU with a fake backend. `VLLMBackend` is the only code that touches vLLM, and imports it lazily.

vLLM API targeted: the v1 `LLMEngine` of vLLM 0.11 to 0.33 (vllm/v1/engine/llm_engine.py; every call below is
listed in api.py and checked against a real release by benchmarks/gpu/vllm_api.py):
`LLMEngine.from_engine_args(EngineArgs(..., worker_extension_cls=..., scheduling_policy="priority"))`,
`add_request(request_id: str, prompt: TokensPrompt, params: SamplingParams, priority: int)` (lower
first), `abort_request(list[str])`, `step() -> list[RequestOutput]`, `collective_rpc(method, args=...)`
(runs a method of the worker extension in every worker, where
`self.model_runner.model.load_weights(weights=[(name, tensor), ...])` maps Hugging Face names onto
vLLM's fused layers), and `reset_prefix_cache()`. Behaviour logprobs use `logprobs_mode=
"processed_logprobs"` (after temperature), what the trainer's forward computes for the same tokens;
with top_p < 1 vLLM's processed logprobs are also renormalised over the nucleus, unlike the torch engine.

A LoRA policy's versions come as adapters (`load_adapter`): each is registered as a LoRA adapter of its own
(engines/lora/slots.py: id version + 1, the newest η + 1 kept), and the same abort/resubmit moves every request
in flight onto it: the base weights never change, and no request runs under an adapter that was removed.

Not here: stop strings inside vLLM (the engine checks eos, stop sequences and stop strings itself,
over the whole output, so a stop that straddles an interruption is still found).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor

from areal.engines.generation import FinishReason, GenRequest, GenResult, InFlight
from areal.engines.lora.slots import AdapterSlots
from areal.engines.sampling import (
    check_sampling,
    checked_request,
    finish_reason,
    request_seed,
    request_stops,
    run_to_completion,
)

MISSING_VLLM = ("generation.engine=\"vllm\" needs the 'vllm' package (pip install 'areal[gpu]'); "
                "generation.engine=\"torch\" runs without it.")


@dataclass(frozen=True)
class Sampling:
    """What a backend needs to sample one request; `seed` makes the request reproducible."""

    temperature: float
    top_p: float
    seed: int


@dataclass(frozen=True)
class BackendOutput:
    """New tokens of one backend request since the last `step`; `finished` when the backend stopped it."""

    request_id: str
    token_ids: list[int]
    logprobs: list[float]  # log π_behav of each new token
    finished: bool = False


class Backend(Protocol):
    """The device side: a continuous-batching engine with abort and in-place weight loading."""

    def add_request(self, request_id: str, token_ids: list[int], max_tokens: int, sampling: Sampling,
                    resumed: bool, lora_id: int = 0) -> None: ...  # resumed: ahead of every request not yet
    # started; lora_id: the LoRA adapter it samples with (0: none, the base)
    def abort(self, request_ids: list[str]) -> None: ...
    def add_lora(self, lora_id: int, path: str) -> None: ...  # a PEFT directory, registered under lora_id > 0
    def remove_lora(self, lora_id: int) -> None: ...
    def step(self) -> list[BackendOutput]: ...
    def load_weights(self, state_dict: dict[str, Tensor]) -> None: ...
    def join_weight_group(self, rendezvous: str, member: int, size: int) -> None: ...
    def receive_weights(self) -> None: ...


@dataclass(kw_only=True)
class _Request(InFlight):
    attempt: int = 0  # resubmissions after an interrupt

    @property
    def backend_id(self) -> str:
        # a new id per attempt: outputs of an aborted attempt that arrive late are recognised and dropped
        return f"{self.request_id}.{self.attempt}"


class VLLMGenerationEngine:
    """The GenerationEngine interface over any `Backend`; see the module doc for interruption."""

    def __init__(
        self,
        backend: Backend,
        *,
        eos_token_id: int,
        max_new_tokens: int = 128,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop_sequences: Sequence[Sequence[int]] | None = None,
        stop_strings: Sequence[str] | None = None,
        decode: Callable[[list[int]], str] | None = None,
        seed: int = 0,
        version: int = 0,
        adapters: AdapterSlots | None = None,
    ) -> None:
        """`adapters`: where a LoRA policy's adapters are written and how many stay registered (None: no LoRA)."""
        check_sampling("VLLMGenerationEngine", temperature, top_p, stop_strings, decode)
        self.backend = backend
        self.eos_token_id = eos_token_id
        self.max_new_tokens = max_new_tokens
        self.temperature, self.top_p = temperature, top_p
        self.stop_sequences = [list(s) for s in stop_sequences or [] if len(s)]
        self.stop_strings = list(stop_strings or [])
        self._stop_window = max((len(s) for s in self.stop_strings), default=0)
        self.decode = decode
        self.seed = seed
        self.version = version
        self.interruptions = 0  # requests aborted and resubmitted by weight updates, for metrics
        self.adapters = adapters
        self.lora_id = 0  # the adapter every request is sent under (0: the base, no adapter)
        self._running: dict[str, _Request] = {}  # backend id of the current attempt -> request

    # ---- the GenerationEngine interface ------------------------------------------------------

    def submit(self, requests: Iterable[GenRequest]) -> None:
        """Send requests to the backend. All are checked before any is sent."""
        in_flight = {r.request_id for r in self._running.values()}
        new = []
        for r in requests:
            prompt, limit = checked_request(r, in_flight, self.max_new_tokens)
            new.append(_Request(request_id=r.request_id, prompt=prompt, limit=limit,
                                stops=request_stops(r, self.stop_strings, self.decode)))
            in_flight.add(r.request_id)
        for req in new:
            self._send(req)

    def pending(self) -> int:
        return len(self._running)

    def update_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        """Abort everything in flight, load the weights into the live backend, resubmit with the tokens so far."""
        self._interrupted_by(lambda: self.backend.load_weights(state_dict), version)

    def load_adapter(self, adapter: dict[str, Tensor], version: int) -> None:
        """A LoRA policy's version: registered as an adapter of its own, every request in flight aborted and
        resubmitted under it with its tokens so far; the adapters past the newest η + 1 removed."""
        if self.adapters is None:
            raise ValueError("VLLMGenerationEngine: a LoRA adapter arrived, but the engine was started without LoRA "
                             "(the policy's trainer.lora.rank must be known when the generator starts)")
        lora_id, path, retired = self.adapters.register(adapter, version)

        def switch() -> None:
            self.backend.add_lora(lora_id, str(path))
            self.lora_id = lora_id
            for old in retired:
                self.backend.remove_lora(old)

        self._interrupted_by(switch, version)

    def join_weight_group(self, rendezvous: str, member: int, size: int) -> None:
        """Make the backend's worker a member of the trainer's weights group (transport.weights=broadcast)."""
        self.backend.join_weight_group(rendezvous, member, size)

    def receive_weights(self, version: int) -> None:
        """`update_weights`, with the weights arriving in the backend's worker over the weights group."""
        self._interrupted_by(self.backend.receive_weights, version)

    def _interrupted_by(self, load: Callable[[], None], version: int) -> None:
        interrupted = list(self._running.values())
        if interrupted:
            self.backend.abort([r.backend_id for r in interrupted])
        self._running.clear()
        load()
        self.version = version
        for req in interrupted:
            req.attempt += 1
            self._send(req)
        self.interruptions += len(interrupted)

    def step(self) -> list[GenResult]:
        """One backend step; returns the requests that finished in it."""
        finished: list[GenResult] = []
        for out in self.backend.step():
            req = self._running.get(out.request_id)
            if req is None:
                continue  # an aborted attempt's late output: its request was resubmitted under a new id
            reason = self._append(req, out)
            if reason is None and out.finished:
                reason = "length"  # the backend ran out of room (max_tokens or the model's context)
            if reason is not None:
                del self._running[out.request_id]
                if not out.finished:
                    self.backend.abort([out.request_id])
                finished.append(req.result(reason))
        return finished

    def generate(self, requests: Iterable[GenRequest]) -> list[GenResult]:
        """Run the given requests to completion; results in the order of the requests."""
        return run_to_completion(self, requests)

    def progress(self) -> dict[int, tuple[int, int]]:
        """Each request that has sampled: (output tokens so far, the version of its oldest)."""
        return {r.request_id: (len(r.output), r.versions[0]) for r in self._running.values() if r.output}

    def abort(self, request_ids: Iterable[int]) -> dict[int, int]:
        """Stop these requests in the backend; the output tokens each had sampled."""
        ids = set(request_ids)
        gone = {backend_id: r for backend_id, r in self._running.items() if r.request_id in ids}
        if gone:
            self.backend.abort(list(gone))
        for backend_id in gone:
            del self._running[backend_id]
        return {r.request_id: len(r.output) for r in gone.values()}

    def requeue(self, request_ids: Iterable[int]) -> dict[int, int]:
        """Abort these requests' attempts and resubmit each with its tokens so far (ahead of the requests not yet
        started, behind the ones resubmitted before); the output tokens each holds."""
        ids = set(request_ids)
        moved = {backend_id: r for backend_id, r in self._running.items() if r.request_id in ids}
        if moved:
            self.backend.abort(list(moved))
        for backend_id, req in moved.items():
            del self._running[backend_id]
            req.attempt += 1
            self._send(req)
        return {r.request_id: len(r.output) for r in moved.values()}

    def time_split(self) -> dict[str, float]:
        """Nothing: vLLM's scheduler mixes prefill and decode in one step, so no phase has a time of its own."""
        return {}

    # ---- internals ----------------------------------------------------------------------------

    def _send(self, req: _Request) -> None:
        context = req.prompt.tolist() + req.output
        # a fresh seed per resubmission: the backend restarts a seeded stream from its beginning
        sampling = Sampling(self.temperature, self.top_p, request_seed(request_seed(self.seed, req.request_id),
                                                                       len(req.output)))
        self._running[req.backend_id] = req
        self.backend.add_request(req.backend_id, context, req.limit - len(req.output), sampling,
                                 resumed=req.attempt > 0, lora_id=self.lora_id)

    def _append(self, req: _Request, out: BackendOutput) -> FinishReason | None:
        """Record the new tokens one by one, stopping at the first that ends the request."""
        for token, logp in zip(out.token_ids, out.logprobs, strict=True):
            req.output.append(int(token))
            req.logprobs.append(float(logp))
            req.versions.append(self.version)
            reason = self._finish_reason(req)
            if reason is not None:
                return reason
        return None

    def _finish_reason(self, req: _Request) -> FinishReason | None:
        window = self._stop_window if req.stops is self.stop_strings else max(map(len, req.stops), default=0)
        return finish_reason(req.output, req.limit, self.eos_token_id, self.stop_sequences, req.stops,
                             self.decode, window)


# ---- the real backend ---------------------------------------------------------------------------


def import_vllm() -> Any:
    """The vllm module, or one sentence saying how to get it."""
    try:
        return importlib.import_module("vllm")
    except ImportError:
        raise ImportError(MISSING_VLLM) from None


class WeightLoader:
    """vLLM worker extension (runs inside each vLLM worker): load named tensors into the live model.

    With transport.weights=broadcast the worker itself joins the trainer's weights group (NCCL), so
    the tensors go from GPU to GPU without passing through the generate worker's process.
    """

    model_runner: Any  # set by vLLM's worker

    def areal_load_weights(self, named: list[tuple[str, Tensor]]) -> None:
        self.model_runner.model.load_weights(weights=named)

    def areal_join_weight_group(self, rendezvous: str, member: int, size: int) -> None:
        from areal.engines.weight_group import WeightGroup

        self.areal_weights = WeightGroup(rendezvous, member, size, device="cuda")

    def areal_receive_weights(self) -> None:
        self.model_runner.model.load_weights(weights=list(self.areal_weights.receive().items()))


class VLLMBackend:
    """`Backend` over vLLM's v1 LLMEngine; token ids in, token ids and logprobs out (no detokenising)."""

    def __init__(self, model: str, *, dtype: str = "auto", seed: int = 0, gpu_memory_utilization: float = 0.5,
                 max_num_seqs: int = 256, **engine_args: Any) -> None:
        vllm = import_vllm()
        from vllm.sampling_params import RequestOutputKind  # type: ignore[import-not-found]

        self._vllm = vllm
        self._delta = RequestOutputKind.DELTA  # each step returns only the new tokens
        args = vllm.EngineArgs(
            model=model, dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
            max_num_seqs=max_num_seqs, skip_tokenizer_init=True, logprobs_mode="processed_logprobs",
            worker_extension_cls=f"{__name__}.WeightLoader", scheduling_policy="priority", **engine_args,
        )
        self.engine = vllm.LLMEngine.from_engine_args(args)
        self._loras: dict[int, Any] = {}  # lora id -> its LoRARequest (engine_args' enable_lora: LoRA policies)

    def add_request(self, request_id: str, token_ids: list[int], max_tokens: int, sampling: Sampling,
                    resumed: bool, lora_id: int = 0) -> None:
        params = self._vllm.SamplingParams(
            max_tokens=max_tokens, temperature=sampling.temperature, top_p=sampling.top_p, seed=sampling.seed,
            logprobs=0, detokenize=False, output_kind=self._delta,
        )
        lora = self._loras[lora_id] if lora_id else None
        self.engine.add_request(request_id, {"prompt_token_ids": token_ids}, params, lora_request=lora,
                                priority=-1 if resumed else 0)

    def add_lora(self, lora_id: int, path: str) -> None:
        from vllm.lora.request import LoRARequest  # type: ignore[import-not-found]

        self._loras[lora_id] = LoRARequest(lora_name=f"areal-{lora_id}", lora_int_id=lora_id, lora_path=path)
        if not self.engine.add_lora(self._loras[lora_id]):
            raise RuntimeError(f"vLLM refused LoRA adapter {lora_id} from {path}")

    def remove_lora(self, lora_id: int) -> None:
        self.engine.remove_lora(lora_id)
        self._loras.pop(lora_id, None)

    def abort(self, request_ids: list[str]) -> None:
        self.engine.abort_request(request_ids)

    def step(self) -> list[BackendOutput]:
        outs = []
        for ro in self.engine.step():
            completion = ro.outputs[0]
            tokens = list(completion.token_ids)
            logprobs = [completion.logprobs[i][t].logprob for i, t in enumerate(tokens)] if tokens else []
            outs.append(BackendOutput(ro.request_id, tokens, logprobs, finished=bool(ro.finished)))
        return outs

    def load_weights(self, state_dict: dict[str, Tensor]) -> None:
        self.engine.collective_rpc("areal_load_weights", args=(list(state_dict.items()),))
        # resubmitted prompts would otherwise reuse KV blocks computed with the old weights
        self.engine.reset_prefix_cache()

    def join_weight_group(self, rendezvous: str, member: int, size: int) -> None:
        # one member per engine: vLLM's tensor parallelism (several workers) is not supported here
        self.engine.collective_rpc("areal_join_weight_group", args=(rendezvous, member, size))

    def receive_weights(self) -> None:
        self.engine.collective_rpc("areal_receive_weights")
        self.engine.reset_prefix_cache()

"""Generation on an emulated device: continuous batching that takes modelled time and computes nothing.

`generation.engine=emulated` swaps this in for the torch or vLLM engine behind the same Protocol
(submit / step / pending / update_weights), so the generate node, the worker's stream loop, the
staleness gate and weights publication run unchanged around it. It keeps the engine's behaviour
that the runtime relies on:

- continuous batching: up to `max_batch` sequences run at once, and a waiting request joins as soon
  as a slot is free, after a prefill of its prompt (which also samples its first token);
- interruptible generation: `update_weights` costs the profile's `weights_load_s`, and the next step
  re-prefills every running sequence's context (prompt and tokens so far) before decoding on (not with
  `keep_kv_on_update`, which decodes on over the old KV as the torch engine's option does); tokens
  sampled before keep their version, later ones record the new one;
- re-queueing (`requeue`, staleness_policy=recycle): a running sequence leaves its slot for the front
  of the queue with its output; readmitted, its prefill reads prompt and output;
- a regenerated sample is the same sample: its length and tokens are drawn from its request id.

A decode step of b sequences over C cached tokens costs `DeviceProfile.decode_s(b, C)`. One `step()`
runs as many decode steps as fit in `quantum_s` of real time (at least one, and never past the next
sequence to finish), so at a fast time scale the host wakes a few dozen times a second, not once a
token, and new requests or weights still land within a quantum.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from areal.engines.emulated.device import ByteTokenizer, DeviceProfile, ModelledClock, OutputLengths, token_logprobs
from areal.engines.generation import GenRequest, GenResult
from areal.engines.sampling import checked_request, run_to_completion

QUANTUM_S = 0.02  # real seconds of modelled decoding per step() at most (one decode step at least)


@dataclass
class _Sequence:
    request_id: int
    prompt: torch.Tensor  # [P] int64
    length: int  # output tokens it will have
    capped: bool  # its drawn length reached the request's max_new_tokens
    done: int = 0  # output tokens sampled so far
    runs: list[tuple[int, int]] = field(default_factory=list)  # (first output index, version) of each run
    prompt_len: int = field(init=False)  # an int, not len(prompt): context is summed over the batch every step

    def __post_init__(self) -> None:
        self.prompt_len = len(self.prompt)

    @property
    def context(self) -> int:
        return self.prompt_len + self.done

    def sample(self, tokens: int, version: int) -> None:
        if not self.runs or self.runs[-1][1] != version:
            self.runs.append((self.done, version))
        self.done += tokens


class EmulatedGenerationEngine:
    """The GenerationEngine Protocol on a modelled device; see the module doc."""

    def __init__(
        self,
        profile: DeviceProfile,
        *,
        lengths: OutputLengths,
        max_new_tokens: int,
        max_batch: int,
        time_scale: float,
        seed: int = 0,
        version: int = 0,
        eos_token_id: int = ByteTokenizer.eos_token_id,
        quantum_s: float = QUANTUM_S,
        keep_kv_on_update: bool = False,
    ) -> None:
        if max_batch < 1 or max_new_tokens < 1:
            raise ValueError(f"EmulatedGenerationEngine: need max_batch >= 1 and max_new_tokens >= 1, got "
                             f"{max_batch} and {max_new_tokens}")
        self.profile = profile
        self.lengths = lengths
        self.max_new_tokens = max_new_tokens
        self.max_batch = max_batch
        self.seed = seed
        self.version = version
        self.eos_token_id = eos_token_id
        self.clock = ModelledClock(time_scale)
        self.quantum_s = quantum_s
        self.keep_kv_on_update = keep_kv_on_update
        self._waiting: deque[_Sequence] = deque()
        self._active: list[_Sequence] = []
        self._stale = False  # weights changed under running sequences: their KV cache is gone
        self.modelled_s = {"prefill": 0.0, "rebuild": 0.0, "decode": 0.0, "weights": 0.0}

    def submit(self, requests: Iterable[GenRequest]) -> None:
        """Queue requests; like the torch engine, all are checked before any is queued."""
        in_flight = {s.request_id for s in self._active} | {s.request_id for s in self._waiting}
        queued = []
        for r in requests:
            prompt, limit = checked_request(r, in_flight, self.max_new_tokens)
            drawn = self.lengths.draw(r.request_id, limit + 1)
            queued.append(_Sequence(r.request_id, prompt, min(drawn, limit), capped=drawn > limit))
            in_flight.add(r.request_id)
        self._waiting.extend(queued)

    def pending(self) -> int:
        return len(self._active) + len(self._waiting)

    def update_weights(self, state_dict: object, version: int) -> None:
        """Take a new version: its transfer costs `weights_load_s` now, the re-prefill (unless `keep_kv_on_update`)
        at the next step."""
        self.version = version
        self._stale = bool(self._active) and not self.keep_kv_on_update
        self._spend("weights", self.profile.weights_load_s)

    def time_split(self) -> dict[str, float]:
        """Modelled seconds so far per phase, taking weights included."""
        return dict(self.modelled_s)

    def generate(self, requests: Iterable[GenRequest]) -> list[GenResult]:
        return run_to_completion(self, requests)

    def progress(self) -> dict[int, tuple[int, int]]:
        """Each request that has sampled: (output tokens so far, the version of its oldest)."""
        return {s.request_id: (s.done, s.runs[0][1]) for s in (*self._active, *self._waiting) if s.done}

    def abort(self, request_ids: Iterable[int]) -> dict[int, int]:
        """Stop these requests where they are (running or waiting); the output tokens each had sampled."""
        ids = set(request_ids)
        gone = {s.request_id: s.done for s in (*self._active, *self._waiting) if s.request_id in ids}
        self._active = [s for s in self._active if s.request_id not in ids]
        self._waiting = deque(s for s in self._waiting if s.request_id not in ids)
        return gone

    def requeue(self, request_ids: Iterable[int]) -> dict[int, int]:
        """Send these running requests to the front of the queue with what they sampled (ahead of newer requests,
        so a full queue cannot starve them): readmitted, each pays a prefill of its prompt and output so far and
        samples on. The output tokens each holds."""
        ids = set(request_ids)
        moved = [s for s in self._active if s.request_id in ids]
        self._active = [s for s in self._active if s.request_id not in ids]
        self._waiting.extendleft(reversed(moved))
        return {s.request_id: s.done for s in moved}

    def step(self) -> list[GenResult]:
        """Admit waiting requests into free slots (and re-prefill after new weights), then decode."""
        finished: list[_Sequence] = []
        admit = [self._waiting.popleft() for _ in range(min(self.max_batch - len(self._active), len(self._waiting)))]
        rebuild = self._active if self._stale else []
        self._stale = False
        if rebuild or admit:
            reread, read = sum(s.context for s in rebuild), sum(s.context for s in admit)
            prefill = self.profile.prefill_s(reread + read)
            for s in admit:  # the prefill's last logits sample each newcomer's next token (a re-queued one's too)
                s.sample(1, self.version)
                (finished if s.done >= s.length else self._active).append(s)
            self._spend("rebuild", prefill * reread / (reread + read))  # the running rows' share of the forward
            self._spend("prefill", prefill * read / (reread + read))
        if self._active:
            batch, context = len(self._active), sum(s.context for s in self._active)
            to_next = min(s.length - s.done for s in self._active)
            budget = self.quantum_s / self.clock.time_scale if self.clock.time_scale > 0 else float("inf")
            steps = max(1, min(to_next, self.profile.decode_steps_within(batch, context, budget)))
            cost = self.profile.decode_s(batch, context, steps)
            for s in self._active:
                s.sample(steps, self.version)
            finished += [s for s in self._active if s.done >= s.length]
            self._active = [s for s in self._active if s.done < s.length]
            self._spend("decode", cost)
        return [self._result(s) for s in finished]

    def _spend(self, kind: str, seconds: float) -> None:
        self.modelled_s[kind] += seconds
        self.clock.spend(seconds)

    def _result(self, s: _Sequence) -> GenResult:
        """The finished sequence's tokens, drawn from its request id: printable bytes, then <eos> unless capped."""
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + s.request_id) & ((1 << 63) - 1))
        low, high = ByteTokenizer.SAMPLED
        output = torch.randint(low, high, (s.length,), generator=g, dtype=torch.int64)
        if not s.capped:
            output[-1] = self.eos_token_id
        starts = [start for start, _ in s.runs] + [s.length]
        counts = torch.tensor([b - a for a, b in zip(starts, starts[1:])], dtype=torch.int64)
        versions = torch.repeat_interleave(torch.tensor([v for _, v in s.runs], dtype=torch.int32), counts)
        positions = torch.arange(len(s.prompt), len(s.prompt) + s.length)
        return GenResult(request_id=s.request_id, prompt_ids=s.prompt, output_ids=output,
                         logprobs=token_logprobs(output, positions), versions=versions,
                         finish_reason="length" if s.capped else "eos")

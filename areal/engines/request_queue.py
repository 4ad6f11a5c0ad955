"""What both torch engines do around their batch alike: requests checked and queued, progress, abort, re-queue,
weight updates and timings.

TorchGenerationEngine (a left-padded batch over the model's own cache) and SlotGenerationEngine (a slot cache and
a step of fixed shape) differ only in where running rows live; the caller-facing half is written once here, so the
two cannot drift apart. An engine says how it holds a request (`_queued`), which rows run (`_running`) and how a
row leaves its batch (`_take`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import torch
from torch import Tensor

from areal.engines.generation import GenRequest, GenResult, InFlight
from areal.engines.sampling import check_sampling, checked_request, request_stops, run_to_completion

if TYPE_CHECKING:  # typing has them from Python 3.11; areal runs on 3.10
    from typing_extensions import NotRequired, Required


def split_newcomers(admit: Sequence[Any], kept: set[tuple[int, ...]]) -> tuple[list[Any], list[Any]]:
    """Newcomers that must read their prompt (the first of a prompt not kept, and every re-queued request, which
    reads its output too) and those that copy a kept or fresh read's rows: (fresh, copies), each in admit order."""
    fresh: list[Any] = []
    copies: list[Any] = []
    seen = set(kept)
    for r in admit:
        if r.output:  # a re-queued request reads its prompt and output: nothing to copy
            fresh.append(r)
            continue
        (copies if r.prompt_key in seen else fresh).append(r)
        seen.add(r.prompt_key)
    return fresh, copies


class EngineSettings(TypedDict, total=False):
    """What a torch engine is built with beside its model (QueuedEngine's defaults)."""

    eos_token_id: Required[int]
    pad_token_id: Required[int]
    max_new_tokens: NotRequired[int]
    temperature: NotRequired[float]
    top_p: NotRequired[float]
    stop_sequences: NotRequired[Sequence[Sequence[int]] | None]
    stop_strings: NotRequired[Sequence[str] | None]
    decode: NotRequired[Callable[[list[int]], str] | None]
    max_batch: NotRequired[int]
    refill_min_free: NotRequired[int]
    seed: NotRequired[int]
    version: NotRequired[int]
    keep_kv_on_update: NotRequired[bool]


class QueuedEngine:
    """The GenerationEngine Protocol's bookkeeping over a queue of waiting requests and a batch of running ones."""

    def __init__(
        self,
        model: Any,
        *,
        eos_token_id: int,
        pad_token_id: int,
        max_new_tokens: int = 128,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop_sequences: Sequence[Sequence[int]] | None = None,
        stop_strings: Sequence[str] | None = None,
        decode: Callable[[list[int]], str] | None = None,
        max_batch: int = 16,
        refill_min_free: int = 1,
        seed: int = 0,
        version: int = 0,
        keep_kv_on_update: bool = False,
    ) -> None:
        name = type(self).__name__
        check_sampling(name, temperature, top_p, stop_strings, decode)
        if max_batch < 1 or not 1 <= refill_min_free <= max_batch:
            raise ValueError(f"{name}: need max_batch >= 1 and 1 <= refill_min_free <= max_batch, "
                             f"got max_batch={max_batch}, refill_min_free={refill_min_free}")
        self.model = model.eval() if model is not None else None
        self.eos_token_id, self.pad_token_id = eos_token_id, pad_token_id
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.stop_sequences = [list(s) for s in stop_sequences or [] if len(s)]
        self.stop_strings = list(stop_strings or [])
        self.decode = decode
        self.max_batch, self.refill_min_free = max_batch, refill_min_free
        self.keep_kv_on_update, self.seed, self.version = keep_kv_on_update, seed, version
        self._waiting: deque[Any] = deque()
        self._stale = False  # new weights: the running rows are re-read at the next step
        self._prompts: Any = None  # the engine's kept prompts (a `hits` count, `clear()`), read under these weights
        # seconds spent reading newcomers, re-reading running rows after a weight update, and decoding
        self.timings_s = {"prefill": 0.0, "rebuild": 0.0, "decode": 0.0}

    # ---- what each engine says ----------------------------------------------------------------------------------

    def _queued(self, request: GenRequest, prompt: Tensor, limit: int, stops: list[str]) -> InFlight:
        """How this engine holds a checked request while it waits and runs."""
        raise NotImplementedError

    def _running(self) -> list[Any]:
        """The requests in the batch now."""
        raise NotImplementedError

    def _take(self, ids: set[int]) -> list[Any]:
        """Take the running rows of these requests out of the batch; the requests taken, in batch order."""
        raise NotImplementedError

    def _weights_loaded(self) -> None:
        """New weights are in the model's storage: what the engine derived from them, again (nothing here)."""

    # ---- the GenerationEngine Protocol --------------------------------------------------------------------------

    def submit(self, requests: Iterable[GenRequest]) -> None:
        """Queue requests; they join the batch at a later `step`. All are checked before any is queued."""
        in_flight = {r.request_id for r in self._running()} | {r.request_id for r in self._waiting}
        queued = []
        for r in requests:
            prompt, limit = checked_request(r, in_flight, self.max_new_tokens)
            queued.append(self._queued(r, prompt, limit, request_stops(r, self.stop_strings, self.decode)))
            in_flight.add(r.request_id)
        self._waiting.extend(queued)

    @property
    def prompt_cache_hits(self) -> int:
        """Newcomers that copied a kept prompt's rows instead of reading it."""
        return self._prompts.hits

    def pending(self) -> int:
        """Requests not yet finished: running plus waiting."""
        return len(self._running()) + len(self._waiting)

    def update_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        """Copy new weights into the model's storage now; the next `step` re-reads the running rows with them,
        unless `keep_kv_on_update`. Kept prompts are dropped either way: a newcomer reads its prompt under the
        new weights."""
        with torch.no_grad():
            self.model.load_state_dict(state_dict)
        self._weights_loaded()
        self.version = version
        self._prompts.clear()
        if not self.keep_kv_on_update:
            self._stale = bool(self._running())

    def generate(self, requests: Iterable[GenRequest]) -> list[GenResult]:
        """Run the given requests to completion; results in the order of the requests."""
        return run_to_completion(self, requests)

    def progress(self) -> dict[int, tuple[int, int]]:
        """Each running request: (output tokens so far, the version of its oldest)."""
        return {r.request_id: (len(r.output), r.versions[0]) for r in self._running() if r.output}

    def abort(self, request_ids: Iterable[int]) -> dict[int, int]:
        """Stop these requests where they are (running or waiting); the output tokens each had sampled."""
        ids = set(request_ids)
        gone = {r.request_id: len(r.output) for r in (*self._running(), *self._waiting) if r.request_id in ids}
        self._waiting = deque(r for r in self._waiting if r.request_id not in ids)
        self._take(ids)
        return gone

    def requeue(self, request_ids: Iterable[int]) -> dict[int, int]:
        """Send these running requests to the front of the queue with what they sampled; readmitted, each
        re-prefills its prompt and output under the weights of then and samples on. The output tokens each holds."""
        moved = self._take(set(request_ids))
        self._waiting.extendleft(reversed(moved))
        return {r.request_id: len(r.output) for r in moved}

    def time_split(self) -> dict[str, float]:
        """Seconds spent so far reading newcomers, re-reading running rows after weight updates, and decoding."""
        return dict(self.timings_s)

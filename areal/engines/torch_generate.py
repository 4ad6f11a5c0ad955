"""Batched, interruptible token generation on a Hugging Face causal LM, in plain torch.

The one idea: the engine keeps a single KV cache (the model's own `DynamicCache`) for a batch
of *slots*, left-padded to a common length with an attention mask and per-row position ids,
and edits that cache between decode steps instead of restarting the batch:

- a finished row is dropped by indexing its batch dim out (and all-padding columns on the left
  are trimmed);
- continuous refill: waiting requests are prefilled on their own (prompt only) and their cache
  rows are left-padded and concatenated onto the running batch. No running row is ever
  recomputed, so a refill costs one prompt-length forward of the newcomers plus one copy of the
  cache. Refill happens once `refill_min_free` slots are free (the engine's default 1; a run's,
  `generation.refill_min_free`, a quarter of the batch: with a queue that never empties and 128
  rows, a refill at 32 free gave 1.12-1.23x the tokens/s of one at every step, each copying the
  cache; benchmarks/bench_generation.py). Rebuilding the whole batch on every refill would instead
  re-read every running row;
- a weight update (`update_weights`) marks the cache stale: at the next `step` the cache is
  dropped and every running row is re-read with the new weights: each distinct prompt once (a GRPO
  group's rows share theirs, and its newcomers copy it from the prompt cache), then every row's
  output so far (all but the last token, which the next decode step feeds) over a copy of its
  prompt's rows. Tokens sampled before the update keep their version and behaviour logprob; later
  ones record the new version. With `keep_kv_on_update` (`generation.on_new_weights=keep-kv`) the
  running rows instead decode on over the KV the old weights wrote: no re-read, but a token sampled
  after the update comes from neither policy exactly (its behaviour logprob is still the one it was
  drawn with, so the decoupled objective's behaviour term stays true);
- prompts are cached: a newcomer whose prompt was read under the current weights (a GRPO group's other
  samples, a held-out round's other samples of a task) copies that prompt's KV rows and last logits
  instead of reading it in a forward of its own, and newcomers of one prompt in the same refill are read
  once. On a small model a refill of 1-2 rows costs a whole forward's per-call overhead: prefill forwards
  were 41 % of the generator's main thread in the first 40 s of a default run before this. At most
  `max_batch` prompts are kept (least recently used go first), and a weight update empties the cache;
- a re-queued request (`requeue`: staleness_policy=recycle) leaves its row for the front of the queue
  with its output, ahead of newer requests (at the back, a full queue kept the oldest groups waiting while
  their tokens aged past η); readmitted, it is prefilled over its prompt and that output, as a newcomer
  is over its prompt, and samples on from where it was.

Sampling (areal/engines/sampling.py) is reproducible per request, not per batch, and
`GenResult.logprobs` is log π_behav under softmax(logits / temperature) *without* top-p
renormalisation: what the trainer's forward computes for the same tokens, so π_prox / π_behav
compares like with like. With top_p < 1 the tokens are still drawn from the renormalised nucleus.

Not here: speculative decoding, paged attention, beam search; GPU serving is the vLLM engine's job.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from areal.engines.generation import FinishReason, GenRequest, GenResult, InFlight
from areal.engines.kv_rows import append_rows, left_padded, select_rows, trim_padding
from areal.engines.prompt_cache import PromptCache
from areal.engines.request_queue import EngineSettings, QueuedEngine, split_newcomers
from areal.engines.sampling import finish_reason, request_uniforms, sample_tokens

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    from typing_extensions import Unpack  # typing's from Python 3.11; areal runs on 3.10

@dataclass(kw_only=True)
class _Slot(InFlight):
    """A request in flight, with its own stream of uniforms."""

    uniforms: list[float]

    def tokens(self) -> Tensor:
        return torch.cat([self.prompt, torch.tensor(self.output, dtype=torch.int64)])

    @cached_property
    def prompt_key(self) -> tuple[int, ...]:
        return tuple(self.prompt.tolist())


class TorchGenerationEngine(QueuedEngine):
    """Continuous-batching generation over an HF causal LM; driven one `step()` at a time."""

    def __init__(self, model: PreTrainedModel, **settings: Unpack[EngineSettings]) -> None:
        super().__init__(model, **settings)
        # transformers >= 5.2x names the KV cache `cache` (and warns on every call given `past_key_values`,
        # dropped in 5.40); older releases, the GPU images' among them, know only `past_key_values`
        self._cache_name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        # a token decodes to at least one character, so a stop string lies within its length in tokens
        self._stop_window = max((len(s) for s in self.stop_strings), default=0)
        self.device = next(model.parameters()).device
        self._active: list[_Slot] = []  # row i of the cache is _active[i]
        self._cache: Any = None  # the model's DynamicCache for the active rows
        self._mask = torch.zeros(0, 0, dtype=torch.int64, device=self.device)  # [B, T]
        self._pending = torch.zeros(0, dtype=torch.int64, device=self.device)  # [B] last token, not yet fed
        self._positions = torch.zeros(0, dtype=torch.int64, device=self.device)  # [B] its position id
        self._prompts = PromptCache(self.max_batch)  # read under the current weights

    # ---- the engine's own half (request_queue.py has the rest of the Protocol) -----------------------------

    def _queued(self, request: GenRequest, prompt: Tensor, limit: int, stops: list[str]) -> _Slot:
        return _Slot(request_id=request.request_id, prompt=prompt, limit=limit, stops=stops,
                     uniforms=request_uniforms(self.seed, request.request_id, limit))

    def update_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        """As every engine (request_queue.py); the running rows' cache is dropped now unless keep-kv (module doc)."""
        super().update_weights(state_dict, version)
        if not self.keep_kv_on_update:
            self._cache = None

    @torch.no_grad()
    def step(self) -> list[GenResult]:
        """Re-read the running rows if the weights changed, admit waiting requests if slots allow, then one decode
        step for every running row."""
        finished: list[GenResult] = []
        if self._stale:
            start = time.perf_counter()
            self._rebuild(self._active)
            self.timings_s["rebuild"] += time.perf_counter() - start
        free = self.max_batch - len(self._active)
        admit: list[_Slot] = []
        if self._waiting and (free >= self.refill_min_free or not self._active):
            admit = [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]
        if admit:
            finished += self._prefill(admit)
        if self._active:
            finished += self._decode()
        return finished

    # ---- internals ----------------------------------------------------------------------------

    def _running(self) -> list[_Slot]:
        return self._active

    def _take(self, ids: set[int]) -> list[_Slot]:
        """Take the running rows of these requests out of the batch (and its cache); the slots taken."""
        keep = [i for i, s in enumerate(self._active) if s.request_id not in ids]
        taken = [s for s in self._active if s.request_id in ids]
        if not taken:
            return taken
        if self._stale:  # no cache to cut: the next step rebuilds what is left
            self._active = [self._active[i] for i in keep]
        elif not keep:
            self._set_rows([], None, self._mask[:0, :0])
        else:
            index = torch.tensor(keep, dtype=torch.int64, device=self.device)
            select_rows(self._cache, index)
            self._set_rows([self._active[i] for i in keep], self._cache, self._mask[index], self._pending[index],
                           self._positions[index])
        return taken

    def _forward(self, ids: Tensor, mask: Tensor, positions: Tensor, cache: Any) -> tuple[Tensor, Any]:
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_name: cache},
        )
        return out.logits[:, -1], getattr(out, self._cache_name)

    def _rebuild(self, rows: list[_Slot]) -> None:
        """After a weight update, the running rows' cache under the new weights: each distinct prompt read once (a
        GRPO group's rows share one, and it is kept for the group's newcomers), then every row's output but its
        pending token read over a copy of its prompt's rows. A row's output is left-padded in that second
        forward, so its cache row has a masked gap between prompt and output."""
        self._stale = False
        self._set_rows([], None, self._mask[:0, :0])
        if not rows:
            return
        prompts = {s.prompt_key: s.prompt for s in rows}  # a row of the first forward each, in order
        ids, mask = left_padded(list(prompts.values()), self.pad_token_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        logits, cache = self._forward(ids, mask, (mask.cumsum(1) - 1).clamp(min=0), None)
        row_of = {key: row for row, key in enumerate(prompts)}
        for key, row in row_of.items():
            self._prompts.remember(key, cache, row, mask.shape[1] - len(key), logits[row])
        index = torch.tensor([row_of[s.prompt_key] for s in rows], dtype=torch.int64, device=self.device)
        select_rows(cache, index)
        mask = mask[index]
        outputs = [torch.tensor(s.output[:-1], dtype=torch.int64) for s in rows]
        if any(len(o) for o in outputs):
            new_ids, new_mask = left_padded(outputs, self.pad_token_id)
            mask = torch.cat([mask, new_mask.to(self.device)], dim=1)
            positions = (mask.cumsum(1) - 1).clamp(min=0)[:, -new_ids.shape[1] :]
            _, cache = self._forward(new_ids.to(self.device), mask, positions, cache)
        pending = torch.tensor([s.output[-1] for s in rows], dtype=torch.int64, device=self.device)
        positions = torch.tensor([len(s.prompt) + len(s.output) - 1 for s in rows], device=self.device)
        self._set_rows(rows, cache, mask, pending, positions)

    def _prefill(self, admit: list[_Slot]) -> list[GenResult]:
        """Admit newcomers: the first newcomer of a prompt not cached reads it in one forward with the others that
        need one; the rest copy its rows."""
        start = time.perf_counter()
        fresh, copies = split_newcomers(admit, self._prompts.keys())
        self._prompts.touch([s.prompt_key for s in copies])  # the fresh reads then push out others, not these
        finished = self._prefill_forward(fresh) if fresh else []
        if copies:  # rows are copied into a running batch's cache, so there must be one
            finished += self._admit_cached(copies) if self._active else self._prefill_forward(copies)
        self.timings_s["prefill"] += time.perf_counter() - start
        return finished

    def _prefill_forward(self, admit: list[_Slot]) -> list[GenResult]:
        """One left-padded forward: newcomers read their prompt (and a re-queued one its output so far) and sample
        their next token from the last logits."""
        ids, mask = left_padded([s.tokens() for s in admit], self.pad_token_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        logits, cache = self._forward(ids, mask, (mask.cumsum(1) - 1).clamp(min=0), None)
        width = mask.shape[1]
        for row, slot in enumerate(admit):
            if not slot.output:  # a prompt alone: later requests of the same prompt copy it
                self._prompts.remember(slot.prompt_key, cache, row, width - len(slot.prompt), logits[row])
        positions = mask.sum(1)
        return self._admit_rows(admit, cache, logits, mask, positions)

    def _admit_cached(self, admit: list[_Slot]) -> list[GenResult]:
        """Newcomers whose prompt is cached: their rows are the cached ones, left-padded to a common width."""
        cache, mask, logits = self._prompts.rows([s.prompt_key for s in admit], self.device)
        positions = torch.tensor([len(s.prompt) for s in admit], dtype=torch.int64, device=self.device)
        return self._admit_rows(admit, cache, logits, mask, positions)

    def _admit_rows(self, admit: list[_Slot], cache: Any, logits: Tensor, mask: Tensor,
                    positions: Tensor) -> list[GenResult]:
        """Sample each newcomer's first token from `logits`, then merge the rows that go on into the batch."""
        pending, reasons = self._sample_into(admit, logits)
        finished = [slot.result(reason) for slot, reason in zip(admit, reasons, strict=True) if reason is not None]
        keep = [i for i, reason in enumerate(reasons) if reason is None]
        if len(keep) < len(admit):
            index = torch.tensor(keep, dtype=torch.int64, device=self.device)
            select_rows(cache, index)
            mask, pending, positions = mask[index], pending[index], positions[index]
        self._merge([admit[i] for i in keep], cache, mask, pending, positions)
        return finished

    def _decode(self) -> list[GenResult]:
        start = time.perf_counter()
        ones = torch.ones(len(self._active), 1, dtype=torch.int64, device=self.device)
        self._mask = torch.cat([self._mask, ones], dim=1)
        logits, self._cache = self._forward(self._pending[:, None], self._mask, self._positions[:, None], self._cache)
        sampled, reasons = self._sample_into(self._active, logits)
        self._pending, self._positions = sampled, self._positions + 1
        finished = [s.result(r) for s, r in zip(self._active, reasons, strict=True) if r is not None]
        if finished:
            keep = [i for i, r in enumerate(reasons) if r is None]
            index = torch.tensor(keep, dtype=torch.int64, device=self.device)
            if keep:
                select_rows(self._cache, index)
            self._set_rows(
                [self._active[i] for i in keep],
                self._cache if keep else None,
                self._mask[index],
                self._pending[index],
                self._positions[index],
            )
        self.timings_s["decode"] += time.perf_counter() - start
        return finished

    def _sample_into(self, slots: list[_Slot], logits: Tensor) -> tuple[Tensor, list[FinishReason | None]]:
        """Sample one token per row, append it (with logprob and version) to its slot; say who finished."""
        u = torch.tensor([s.uniforms[len(s.output)] for s in slots], dtype=torch.float64, device=self.device)
        tokens, logp = sample_tokens(logits, u, temperature=self.temperature, top_p=self.top_p)
        reasons: list[FinishReason | None] = []
        for slot, tok, lp in zip(slots, tokens.tolist(), logp.tolist(), strict=True):
            slot.output.append(tok)
            slot.logprobs.append(lp)
            slot.versions.append(self.version)
            reasons.append(self._finish_reason(slot))
        return tokens, reasons

    def _finish_reason(self, slot: _Slot) -> FinishReason | None:
        window = self._stop_window if slot.stops is self.stop_strings else max(map(len, slot.stops), default=0)
        return finish_reason(slot.output, slot.limit, self.eos_token_id, self.stop_sequences, slot.stops,
                             self.decode, window)

    def _merge(self, slots: list[_Slot], cache: Any, mask: Tensor, pending: Tensor, positions: Tensor) -> None:
        """Append freshly prefilled rows to the running batch, left-padding whichever is shorter."""
        if not slots:
            return
        if not self._active:
            self._set_rows(slots, cache, mask, pending, positions)
            return
        merged = append_rows(self._cache, self._mask, cache, mask)
        self._set_rows(self._active + slots, self._cache, merged, torch.cat([self._pending, pending]),
                       torch.cat([self._positions, positions]))

    def _set_rows(
        self,
        slots: list[_Slot],
        cache: Any,
        mask: Tensor,
        pending: Tensor | None = None,
        positions: Tensor | None = None,
    ) -> None:
        """Install the running batch, trimming cache columns that are padding in every row."""
        self._active, self._cache = slots, cache
        self._pending = pending if pending is not None else self._pending[:0]
        self._positions = positions if positions is not None else self._positions[:0]
        self._mask = trim_padding(cache, mask) if slots and mask.shape[1] else mask

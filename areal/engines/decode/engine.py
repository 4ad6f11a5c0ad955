"""Continuous-batching generation over a slot cache: what TorchGenerationEngine does, with a decode step of fixed
shape.

The requests, the sampling and everything a caller sees are those of areal/engines/torch_generate.py (read its
module doc for refills, the prompt cache, weight updates, keep-kv and requeue); for the same requests and seed the
tokens are the same. What differs is where the rows live: each running request owns a slot of `SlotKV`
(preallocated for max_batch rows), so

- a newcomer is written into a free slot: its prompt read by a prefill into that slot, or copied there from a kept
  prompt (a GRPO group's other samples; with the CPU kernels, which read a group's prompt from the one slot that
  holds it, only when no running slot does: the holder's columns are copied to another of its group when it is
  freed); nothing running is concatenated or re-padded;
- a finished, aborted or re-queued row frees its slot; the others do not move;
- a decode step (decode/step.py) feeds every running slot its pending token at its own position, draws the next
  token and its behaviour log-prob, and advances the slot state, in one call, eager or replayed from a CUDA graph
  (eager, a free slot among the running ones is skipped; a replay decodes it and ignores it);
- new weights are written into the same parameter storage (decode/lean.py; the packed copies the CPU kernels
  multiply by are packed again); unless keep-kv, the next step re-reads
  the running rows into their slots: each distinct prompt once (kept for its newcomers), copied to the rows that
  share it, then every row's output but its pending token.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from areal.engines.decode.cpu_kernels import Shared
from areal.engines.decode.lean import LeanForward
from areal.engines.decode.requests import KeptPrompts, Request, StopWindows, right_padded, stop_pattern
from areal.engines.decode.slots import SlotKV
from areal.engines.decode.step import DecodeStep, Forward
from areal.engines.generation import FinishReason, GenRequest, GenResult
from areal.engines.lists import list_tensor
from areal.engines.request_queue import EngineSettings, QueuedEngine, split_newcomers
from areal.engines.sampling import sample_tokens, uniform_stream

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11; areal runs on 3.10

# the eager step's rows: the running slots, their requests, the slots as a tensor (or None), which share a prompt
_Layout = tuple[list[int], list[Request], Tensor | None, Shared | None]


class SlotGenerationEngine(QueuedEngine):
    """Continuous-batching generation over a slot cache; driven one `step()` at a time (the GenerationEngine
    Protocol). `forward` replaces the lean forward of `model` (a benchmark's stub); `graphs` captures the decode
    step in CUDA graphs."""

    def __init__(self, model: Any, *, graphs: bool = False, forward: Forward | None = None, capture: Any = None,
                 **settings: Unpack[EngineSettings]) -> None:
        super().__init__(model, **settings)
        self.forward: Forward = forward if forward is not None else LeanForward(model)
        f = self.forward
        self.device = f.device
        # with the CPU kernels: which rows share a prompt (only they read it), and the cache in their layout
        self._share = getattr(f, "kernels", None) is not None
        self.cache = SlotKV(layers=f.num_layers, kv_heads=f.kv_heads, head_dim=f.head_dim, slots=self.max_batch,
                            dtype=f.dtype, device=f.device, uniforms=self.max_new_tokens, by_column=self._share)
        f.reserve(self.cache.columns)
        self._step = DecodeStep(f, self.cache, temperature=self.temperature, top_p=self.top_p, graphs=graphs,
                                capture=capture)
        self._rows: list[Request | None] = [None] * self.max_batch  # slot i runs _rows[i]
        # which read wrote each slot's prompt columns: a group's slots share one source (its prompt)
        self._source = [0] * self.max_batch
        self._sources = 0
        # with the CPU kernels, which read a group's prompt from one slot: the slot holding each running source's
        # prompt columns (its other slots are not given a copy; one of them is when that slot is freed)
        self._holders: dict[int, int] = {}
        self._prompts = KeptPrompts(self.max_batch)
        self._stop_windows = None if self.decode is None else StopWindows(self.decode)
        # _lay_out's, kept while no slot is taken or freed and no prompt read (its key: cache.moves, _sources)
        self._layout: tuple[tuple[int, int], _Layout] | None = None

    # ---- the engine's own half (request_queue.py has the rest of the Protocol) ----------------------------------

    def _queued(self, request: GenRequest, prompt: Tensor, limit: int, stops: list[str]) -> Request:
        return Request(request_id=request.request_id, prompt=prompt, limit=limit, stops=stops,
                       uniforms=uniform_stream(self.seed, request.request_id, limit),
                       stop_pattern=stop_pattern(tuple(stops)), stop_window=max(map(len, stops), default=0))

    @torch.no_grad()
    def step(self) -> list[GenResult]:
        """Re-read the running rows if the weights changed, admit waiting requests if slots allow, then one decode
        step for every running row."""
        finished: list[GenResult] = []
        if self._stale:
            start = time.perf_counter()
            self._rebuild()
            self.timings_s["rebuild"] += time.perf_counter() - start
        free = self.cache.free
        if self._waiting and (free >= self.refill_min_free or free == self.max_batch):
            start = time.perf_counter()
            finished += self._admit([self._waiting.popleft() for _ in range(min(free, len(self._waiting)))])
            self.timings_s["prefill"] += time.perf_counter() - start
        if self.cache.high:
            start = time.perf_counter()
            finished += self._decode()
            self.timings_s["decode"] += time.perf_counter() - start
        return finished

    # ---- internals --------------------------------------------------------------------------------------------

    def _running(self) -> list[Request]:
        return [r for r in self._rows if r is not None]

    def _take(self, ids: set[int]) -> list[Request]:
        """Free the slots of these running requests; the requests, in slot order."""
        slots = [i for i, r in enumerate(self._rows) if r is not None and r.request_id in ids]
        taken = [self._rows[i] for i in slots]
        for i in slots:
            self._rows[i] = None
        self._release(slots)
        return [r for r in taken if r is not None]

    def _release(self, slots: list[int]) -> None:
        """Free these slots (their requests already out of _rows). One that holds a prompt other running slots
        read (the CPU kernels') first copies it to one of them, which holds it from then on."""
        for slot in slots if self._share else ():
            source = self._source[slot]
            if self._holders.get(source) != slot:
                continue
            heir = next((c for c, r in enumerate(self._rows) if r is not None and self._source[c] == source), None)
            if heir is None:
                del self._holders[source]
            else:
                self.cache.copy_rows(slot, [heir], self._rows[heir].prompt_len)  # type: ignore[union-attr]
                self._holders[source] = heir
        self.cache.release(slots)

    def _weights_loaded(self) -> None:
        self.forward.refresh()

    def _reserve(self, columns: int, uniforms: int = 0) -> None:
        if self.cache.reserve(columns, uniforms):
            self.forward.reserve(self.cache.columns)

    def _extend(self, slots: list[int], rows: list[list[int]], starts: list[int]) -> Tensor:
        """The forward over token chunks written into these slots from `starts`; each row's last logits."""
        ids, lengths = right_padded(rows, self.pad_token_id, self.device)
        self._reserve(max(starts) + ids.shape[1])
        return self.forward.extend(self.cache.kv, list_tensor(slots, torch.int64, self.device), ids,
                                   list_tensor(starts, torch.int64, self.device), lengths)

    def _admit(self, admit: list[Request]) -> list[GenResult]:
        """Newcomers into free slots: the first of a prompt not kept reads it in one forward with the others that
        need one (a re-queued request its prompt and output), the rest copy its rows; then each draws a token."""
        fresh, copies = split_newcomers(admit, self._prompts.keys())
        # take the kept prompts the copies need before the fresh reads are kept: those could push them out
        held = {r.prompt_key: self._prompts.get(r.prompt_key) for r in copies if r.prompt_key in self._prompts}
        ordered = fresh + copies
        # room first: a cache with no slot in use grows without copying what it held
        self._reserve(max(r.prompt_len + r.limit for r in ordered), max(r.limit for r in ordered))
        slots = self.cache.take(len(ordered))
        logits = []
        if fresh:
            read = self._extend(slots[: len(fresh)], [r.tokens() for r in fresh], [0] * len(fresh))
            for row, (slot, r) in enumerate(zip(slots, fresh, strict=False)):
                self._source[slot] = self._new_source()
                if self._share:
                    self._holders[self._source[slot]] = slot
                if not r.output:  # a prompt alone: later requests of the same prompt copy it
                    self._prompts.remember(r.prompt_key, self.cache.rows(slot, r.prompt_len), read[row].clone(),
                                           self._source[slot])
            logits.append(read)
        for slot, r in zip(slots[len(fresh) :], copies, strict=True):
            rows, kept_logits, source = held.get(r.prompt_key) or self._prompts.get(r.prompt_key)
            self._source[slot] = source
            if not self._share:  # the torch ops read each slot's own copy
                self.cache.put_rows(slot, rows)
            elif source not in self._holders:  # no running slot holds it: this one does
                self.cache.put_rows(slot, rows)
                self._holders[source] = slot
            logits.append(kept_logits[None])
        tokens, reasons = self._sample_into(ordered, torch.cat(logits))
        finished, ended = [], []
        for slot, r, reason in zip(slots, ordered, reasons, strict=True):
            if reason is None:
                self._rows[slot] = r
            else:
                finished.append(r.result(reason))
                ended.append(slot)
        self._release(ended)
        going = [(slot, r, t) for slot, r, t, reason in zip(slots, ordered, tokens, reasons, strict=True)
                 if reason is None]
        if going:
            self.cache.start([s for s, _, _ in going], [t for _, _, t in going],
                             [r.prompt_len + len(r.output) - 1 for _, r, _ in going],
                             [len(r.output) for _, r, _ in going], [r.uniforms for _, r, _ in going])
        return finished

    def _rebuild(self) -> None:
        """After a weight update, the running rows' K/V under the new weights: each distinct prompt read once into
        the slot of its first row (and kept for the group's newcomers), copied to the other rows of that prompt,
        then every row's output but its pending token read over it."""
        self._stale = False
        running = [(slot, r) for slot, r in enumerate(self._rows) if r is not None]
        if not running:
            return
        readers: dict[tuple[int, ...], int] = {}
        for slot, r in running:
            readers.setdefault(r.prompt_key, slot)
        reader_rows = [self._rows[slot] for slot in readers.values()]
        read = self._extend(list(readers.values()), [r.prompt.tolist() for r in reader_rows if r is not None],
                            [0] * len(readers))
        for row, (key, slot) in enumerate(readers.items()):
            self._source[slot] = self._new_source()
            self._prompts.remember(key, self.cache.rows(slot, len(key)), read[row].clone(), self._source[slot])
        if self._share:  # every running row's source is now a new read, held by its reader
            self._holders = {self._source[slot]: slot for slot in readers.values()}
        for key, reader in readers.items():
            sharing = [slot for slot, r in running if r.prompt_key == key and slot != reader]
            if sharing:
                self.cache.copy_rows(reader, sharing, len(key))
                for slot in sharing:
                    self._source[slot] = self._source[reader]
        outputs = [(slot, r) for slot, r in running if len(r.output) > 1]
        if outputs:
            self._extend([slot for slot, _ in outputs], [r.output[:-1] for _, r in outputs],
                         [len(r.prompt) for _, r in outputs])

    def _decode(self) -> list[GenResult]:
        rows, high = self._rows, self.cache.high
        if self._step.graphs:  # a replay decodes every slot below high (free ones too) and reads every column
            every, every_logp = (t.tolist() for t in self._step(high, 0))
            taken = [(slot, r) for slot, r in enumerate(rows[:high]) if r is not None]
            running, requests = [slot for slot, _ in taken], [r for _, r in taken]
            tokens, logps = [every[s] for s in running], [every_logp[s] for s in running]
        else:
            running, requests, index, shared = self._lay_out(high)
            # the columns the step reads at most: the longest row's (the C step reads each row's own, and needs
            # only a bound: the cache's)
            width = self.cache.columns if self._step.in_c else int(self.cache.positions[:high].max()) + 1
            tokens, logps = (t.tolist() for t in self._step(high, width, shared, index))
        finished, ended = [], []
        for i, reason in self._record(requests, tokens, logps):
            finished.append(requests[i].result(reason))
            ended.append(running[i])
            rows[running[i]] = None
        self._release(ended)
        return finished

    def _lay_out(self, high: int) -> _Layout:
        """The eager step's rows: the running slots and their requests, the slots as a tensor when free slots sit
        among them (the step then decodes those alone), and for the CPU kernels which rows share a prompt. Remade
        only when a slot was taken or freed (cache.moves) or a prompt read (_sources): nothing else changes what
        runs where."""
        key = (self.cache.moves, self._sources)
        if self._layout is None or self._layout[0] != key:
            taken = [(slot, r) for slot, r in enumerate(self._rows[:high]) if r is not None]
            running = [slot for slot, _ in taken]
            index = None if len(running) == high else list_tensor(running, torch.int64, self.device)
            self._layout = key, (running, [r for _, r in taken], index,
                                 self._shared(running) if self._share else None)
        return self._layout[1]

    def _new_source(self) -> int:
        self._sources += 1
        return self._sources

    def _shared(self, running: list[int]) -> Shared:
        """For the CPU kernels, per row of the step (slot running[i]): the slot holding its source's prompt, the
        prompt columns they share, and an order of the rows that takes a source's rows one after another."""
        source = [self._holders[self._source[slot]] for slot in running]
        columns = [self._rows[slot].prompt_len for slot in running]  # type: ignore[union-attr]
        order = sorted(range(len(running)), key=source.__getitem__)
        return Shared(*(list_tensor(x, torch.int64) for x in (order, source, columns)))

    def _sample_into(self, rows: list[Request], logits: Tensor) -> tuple[list[int], list[FinishReason | None]]:
        """Draw one token a row from `logits`, append it (with logprob and version) to its request; who finished."""
        u = torch.stack([r.uniforms[len(r.output)] for r in rows]).to(self.device, torch.float64)
        tokens, logp = sample_tokens(logits, u, temperature=self.temperature, top_p=self.top_p)
        drawn = tokens.tolist()
        reasons: list[FinishReason | None] = [None] * len(rows)
        for i, reason in self._record(rows, drawn, logp.tolist()):
            reasons[i] = reason
        return drawn, reasons

    def _record(self, rows: list[Request], tokens: list[int], logps: list[float]) -> list[tuple[int, FinishReason]]:
        """Append each row's new token, its log-prob and the version to its request; the rows that end there (their
        index in `rows`, and why), by sampling.finish_reason's rules in its order (eos, a stop sequence, a stop
        string in the decoded last tokens, the length), with the stop strings searched at once. One pass with the
        checks inline: this loop is 5-6 % of a 128-row generate, and a call a row for the checks was 3 ms of it."""
        ended: list[tuple[int, FinishReason]] = []
        version, eos, sequences, windows = self.version, self.eos_token_id, self.stop_sequences, self._stop_windows
        for i, (r, token, lp) in enumerate(zip(rows, tokens, logps, strict=True)):
            out = r.output
            out.append(token)
            r.logprobs.append(lp)
            r.versions.append(version)
            if token == eos:
                ended.append((i, "eos"))
            elif sequences and any(len(s) <= len(out) and out[-len(s) :] == s for s in sequences):
                ended.append((i, "stop"))
            elif r.stop_pattern is not None and windows.holds_stop(r):  # type: ignore[union-attr]
                ended.append((i, "stop"))  # (a request with stop strings was refused without a decode)
            elif len(out) >= r.limit:
                ended.append((i, "length"))
        return ended

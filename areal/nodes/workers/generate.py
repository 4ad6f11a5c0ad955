"""What runs inside a generate worker: the engine `generation.engine` names, driven one step at a time.

Each submitted batch holds prompts (one group for training, many prompts for evaluation); each
prompt becomes `samples` requests whose request id is the sample id, so a sample regenerated
after a resume draws the same random numbers. A batch is returned once all of its samples
finished, with the prompt's fields repeated per sample.

With transport.weights=broadcast the worker is a member of the weights group (engines/
weight_group.py, through nodes/workers/policy_copy.py): it takes the trainer's weights when the group
forms, and each new version the moment it is told one is coming.

A training sample whose generation is over-long (it hit max_new_tokens) or empty (no text left
after the stop cut) is reported to the controller ("noted", with its id and reason): it trains
on like any other and earns its reward, but the run's accounting counts it.

A sample lives within the model's context (max_position_embeddings): a prompt that leaves less room than
max_new_tokens generates only as far as the context goes (cut there, noted over-long); one that fills it is never
sampled and its samples fail, naming its length (a position past the context is one the model never learnt).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from areal.graph.batch import Batch, Ragged
from areal.graph.meta import GroupMeta
from areal.graph.roles import FAILED


@dataclass
class _Pending:
    batch: Batch
    meta: GroupMeta
    samples: int
    sample_ids: list[int]  # every sample it will return, finished or not
    results: dict[int, Any] = field(default_factory=dict)  # sample id -> GenResult
    refused: dict[int, str] = field(default_factory=dict)  # sample id -> why it was never sampled

    @property
    def expected(self) -> int:
        return self.batch.size * self.samples


class GenerateNode:
    def __init__(self, model: str | None = None) -> None:
        self.model_name = model
        self._pending: dict[int, _Pending] = {}  # sample id -> its batch
        self._batches: list[_Pending] = []
        self._split_at: dict[str, float] = {}  # the engine's time per phase at the last weight update
        self.context_tokens: int | None = None  # the model's context, where its config says it
        self.max_new_tokens = 0

    def setup(self, context: Any) -> None:
        from areal.nodes.workers.policy_copy import PolicyCopy

        self.note, self.report = context.note, context.report
        self.group_size = context.config.group_size  # the run's, with this node's own setting in it
        self.policy = PolicyCopy(context)
        self.engine, self.tokenizer = self.policy.engine, self.policy.tokenizer
        self.stops, self.chat = self.policy.stops, self.policy.chat
        self.context_tokens, self.max_new_tokens = self.policy.context_tokens, context.config.generation.max_new_tokens

    @property
    def version(self) -> int:
        """The policy version of the weights it samples with: its engine's, the only count of it here."""
        return self.engine.version

    @version.setter
    def version(self, version: int) -> None:
        self.engine.version = version  # the weights it holds already, named (v0, or taken in a collective)

    def receive_weights(self, version: int) -> None:
        """Take part in the trainer's broadcast of `version`; in-flight requests continue on the new weights."""
        self.policy.receive_weights(version)
        self._report_time_split()

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def pending(self) -> int:
        """Requests the engine holds, and batches complete without it (every prompt in them refused)."""
        return self.engine.pending() + sum(len(b.results) == b.expected for b in self._batches)

    def load_weights(self, weights: Mapping[str, Tensor], version: int) -> None:
        self.policy.deliver(self.engine, weights, version)  # the engine a test may have put in place
        self._report_time_split()

    def _report_time_split(self) -> None:
        """The engine's share of time per phase since the last weight update, averaged into the step's metrics
        (`generator_rebuild_share`: re-reading running rows under the new weights, the price of interruption)."""
        now = self.engine.time_split()
        spent = {phase: seconds - self._split_at.get(phase, 0.0) for phase, seconds in now.items()}
        self._split_at = now
        if (total := sum(spent.values())) > 0:
            self.report("metrics", values={f"generator_{phase}_share": s / total for phase, s in spent.items()})

    def submit(self, batch: Batch, meta: GroupMeta) -> None:
        from areal.engines.generation import GenRequest, new_tokens_fitting

        samples = meta.samples
        groups = batch["group_id"].tolist()
        # held-out ids are unique already
        sample_ids = [[g * samples + k if g >= 0 else g for k in range(samples)] for g in groups]
        in_flight = {sid for entry in self._batches for sid in entry.sample_ids}
        if any(sid in in_flight for ids in sample_ids for sid in ids):
            # re-issued after a crash downstream while still here (some of its samples may have finished
            # already): the copy in flight answers for it, and the engine would refuse the repeated ids
            return
        stamped = meta if meta.eval else replace(meta, stamped_at=self.engine.version)  # recycle's stamp
        entry = _Pending(batch, stamped, samples, [sid for ids in sample_ids for sid in ids])
        requests = []
        for prompt, ids in zip(batch["prompt"], sample_ids):
            prompt_ids, why = self._encoded(prompt)
            if why is not None:  # its samples fail, named; the rest of the batch runs
                for sid in ids:
                    entry.results[sid], entry.refused[sid] = _never_sampled(sid, prompt_ids), why
                continue
            fitting = new_tokens_fitting(self.max_new_tokens, len(prompt_ids), self.context_tokens)
            limit = fitting if fitting < self.max_new_tokens else None  # the context ends first
            requests += [GenRequest(request_id=sid, prompt_ids=prompt_ids, max_new_tokens=limit) for sid in ids]
        self.engine.submit(requests)  # checks every request before queueing any: raise before any bookkeeping
        self._pending.update((r.request_id, entry) for r in requests)
        self._batches.append(entry)

    def _encoded(self, prompt: Any) -> tuple[list[int], str | None]:
        """A prompt's token ids and, where it cannot be sampled, why: neither text nor chat messages, nothing to read,
        or no room left in the model's context."""
        from areal.models.chat import encode_prompt, is_chat

        if not (isinstance(prompt, str) or is_chat(prompt)):
            return [], (f"its prompt is {type(prompt).__name__} {prompt!r:.60}, not text or chat messages "
                        "[{'role': str, 'content': str}, ...]")
        prompt_ids = encode_prompt(self.tokenizer, prompt, self.chat)
        if not prompt_ids:
            return prompt_ids, "its prompt is empty"
        if self.context_tokens is not None and len(prompt_ids) >= self.context_tokens:
            return prompt_ids, (f"its prompt is {len(prompt_ids)} tokens and the model's context {self.context_tokens} "
                                "(max_position_embeddings): no room left to generate")
        return prompt_ids, None

    def abort_older_than(self, version: int) -> list[tuple[GroupMeta, list[int], list[int]]]:
        """Stop every training group holding a token sampled by a version below `version` (a staleness policy
        that drops it); for each, its meta, its sample ids and the output tokens each had (wasted now)."""
        progress = self.engine.progress()
        aborted = []
        for entry in [b for b in self._batches if not b.meta.eval]:
            oldest = [progress[sid][1] for sid in entry.sample_ids if sid in progress]
            oldest += [int(r.versions.min()) for r in entry.results.values() if len(r.versions)]
            if not oldest or min(oldest) >= version:
                continue
            stopped = self.engine.abort([sid for sid in entry.sample_ids if sid not in entry.results])
            tokens = [len(entry.results[sid].output_ids) if sid in entry.results else stopped.get(sid, 0)
                      for sid in entry.sample_ids]
            for sid in entry.sample_ids:
                self._pending.pop(sid, None)
            self._batches.remove(entry)
            aborted.append((entry.meta, entry.sample_ids, tokens))
        return aborted

    def recycle_stamped_before(self, version: int) -> list[tuple[GroupMeta, int]]:
        """Re-queue every training group stamped before `version` (staleness_policy=recycle): its running samples
        go to the front of the engine's queue with their tokens, and it is stamped with the engine's version. For
        each, its new meta and the output tokens its re-queued samples carry."""
        recycled = []
        for entry in [b for b in self._batches if not b.meta.eval]:
            assert entry.meta.stamped_at is not None  # submit stamps every training group
            if entry.meta.stamped_at >= version:
                continue
            moved = self.engine.requeue([sid for sid in entry.sample_ids if sid not in entry.results])
            entry.meta = replace(entry.meta, stamped_at=self.engine.version)
            recycled.append((entry.meta, sum(moved.values())))
        return recycled

    def step(self) -> list[tuple[Batch, GroupMeta]]:
        for result in self.engine.step():  # nothing to do in it when every prompt of a batch failed
            self._pending.pop(result.request_id).results[result.request_id] = result
        done = [b for b in self._batches if len(b.results) == b.expected]
        self._batches = [b for b in self._batches if len(b.results) != b.expected]
        return [(self._assemble(b), b.meta) for b in done]

    def _assemble(self, entry: _Pending) -> Batch:
        batch, k = entry.batch, entry.samples
        rows, results = [], []
        for row, group in enumerate(batch["group_id"].tolist()):
            for j in range(k):
                rows.append(row)
                results.append(entry.results[group * k + j if group >= 0 else group])
        fields: dict[str, Any] = {}
        for name, value in batch.items():
            if name == "sample_id":
                continue
            fields[name] = value.select(rows) if isinstance(value, Ragged) else (
                value[torch.tensor(rows)] if isinstance(value, torch.Tensor) else [value[r] for r in rows])
        fields["sample_id"] = torch.tensor([r.request_id for r in results], dtype=torch.int64)
        fields["prompt_ids"] = Ragged.from_rows([r.prompt_ids for r in results], dtype=torch.int64)
        fields["output_ids"] = Ragged.from_rows([r.output_ids for r in results], dtype=torch.int64)
        fields["behav_logp"] = Ragged.from_rows([r.logprobs for r in results], dtype=torch.float32)
        fields["versions"] = Ragged.from_rows([r.versions for r in results], dtype=torch.int32)
        fields["completion"] = [self._completion(r.output_ids.tolist()) for r in results]
        fields["truncated"] = torch.tensor([int(r.finish_reason == "length") for r in results], dtype=torch.int64)
        if entry.refused:
            fields[FAILED] = [entry.refused.get(r.request_id) for r in results]
        notes = {r.request_id: why for r, text in zip(results, fields["completion"])
                 if r.request_id not in entry.refused and (why := generation_problem(r.finish_reason, text))}
        if notes and not entry.meta.eval:
            self.note(list(notes), list(notes.values()))
        return Batch(fields)

    def _completion(self, ids: list[int]) -> str:
        """The text the reward sees: decoded, cut before the first stop string."""
        text = self._decode(ids)
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=len(text))
        return text[:cut]


def _never_sampled(request_id: int, prompt_ids: list[int] | Tensor) -> Any:
    """The result of a request refused before sampling: its prompt, no output."""
    from areal.engines.generation import GenResult

    return GenResult(request_id, torch.as_tensor(prompt_ids, dtype=torch.int64), torch.zeros(0, dtype=torch.int64),
                     torch.zeros(0), torch.zeros(0, dtype=torch.int32), "length")


def generation_problem(finish_reason: str, completion: str) -> str | None:
    """Why a finished generation is noted: no text after the stop cut (whitespace is none), or it hit the cap."""
    if not completion.strip():
        return "empty"
    if finish_reason == "length":
        return "over_long"
    return None

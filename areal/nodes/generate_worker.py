"""What runs inside a generate worker: the torch engine, driven one decode step at a time.

Each submitted batch holds prompts (one group for training, many prompts for evaluation); each
prompt becomes `samples` requests whose request id is the sample id, so a sample regenerated
after a resume draws the same random numbers. A batch is returned once all of its samples
finished, with the prompt's fields repeated per sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from areal.graph.batch import Batch, Ragged
from areal.nodes.policy import load_run_policy, load_weights


@dataclass
class _Pending:
    batch: Batch
    meta: dict[str, Any]
    samples: int
    results: dict[int, Any] = field(default_factory=dict)  # sample id -> GenResult

    @property
    def expected(self) -> int:
        return self.batch.size * self.samples


class GenerateNode:
    def __init__(self, group_size: int | None = None, model: str | None = None) -> None:
        self.group_size = group_size
        self.model_name = model
        self._pending: dict[int, _Pending] = {}  # sample id -> its batch
        self._batches: list[_Pending] = []

    def setup(self, context: Any) -> None:
        from areal.engines.torch_generate import TorchGenerationEngine

        config = context.config
        self.group_size = self.group_size or config.group_size
        model, self.tokenizer = load_run_policy(
            config,
            context.run_dir / "weights" / f"v{context.version:06d}.safetensors",
            context.resume_dir / "policy.safetensors" if context.resume_dir else None,
        )
        gen = config.generation
        self.stops = list(gen.stop)
        self.engine = TorchGenerationEngine(
            model, eos_token_id=self.tokenizer.eos_token_id, pad_token_id=self.tokenizer.pad_token_id,
            max_new_tokens=gen.max_new_tokens, temperature=gen.temperature, top_p=gen.top_p,
            stop_strings=self.stops, decode=self._decode, max_batch=gen.max_batch,
            seed=config.seed, version=context.version,
        )

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def pending(self) -> int:
        return self.engine.pending()

    def load_weights(self, path: str | None, version: int) -> None:
        if path is not None:
            self.engine.update_weights(load_weights(path), version)

    def submit(self, batch: Batch, meta: dict[str, Any]) -> None:
        from areal.engines.torch_generate import GenRequest

        samples = int(meta.get("samples", self.group_size))
        entry = _Pending(batch, meta, samples)
        requests = []
        for prompt, group in zip(batch["prompt"], batch["group_id"].tolist()):
            ids = self.tokenizer.encode(prompt)
            for k in range(samples):
                sample_id = group * samples + k if group >= 0 else group  # held-out ids are unique already
                self._pending[sample_id] = entry
                requests.append(GenRequest(request_id=sample_id, prompt_ids=ids))
        self._batches.append(entry)
        self.engine.submit(requests)

    def step(self) -> list[tuple[Batch, dict[str, Any]]]:
        for result in self.engine.step():
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
        return Batch(fields)

    def _completion(self, ids: list[int]) -> str:
        """The text the reward sees: decoded, cut before the first stop string."""
        text = self._decode(ids)
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=len(text))
        return text[:cut]

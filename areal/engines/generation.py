"""What every generation engine (torch, vLLM, emulated) takes and gives: a request and a finished completion."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from areal.engines.lists import list_tensor

FinishReason = Literal["eos", "length", "stop"]


def new_tokens_fitting(wanted: int, prompt_tokens: int, context: int | None) -> int:
    """The new tokens a sample may take: `wanted`, or fewer where the model's context (max_position_embeddings, None
    where its config gives none) ends first; 0 where the prompt fills it (a position past it is one the model never
    learnt)."""
    return wanted if context is None else max(0, min(wanted, context - prompt_tokens))


@dataclass
class GenRequest:
    """One prompt to complete; `max_new_tokens` and `stop` (strings) override the engine's for this request."""

    request_id: int
    prompt_ids: list[int] | Tensor
    max_new_tokens: int | None = None
    stop: Sequence[str] | None = None


@dataclass
class GenResult:
    """A finished completion. `output_ids` includes the eos or stop tokens that ended it."""

    request_id: int
    prompt_ids: Tensor  # [P] int64
    output_ids: Tensor  # [L] int64
    logprobs: Tensor  # [L] float32, log π_behav after temperature (no top-p renormalisation)
    versions: Tensor  # [L] int32, the policy version that sampled each token
    finish_reason: FinishReason


@dataclass(kw_only=True)
class InFlight:
    """A request being sampled, in any engine: the tokens it has so far, each with its log π_behav and the version
    that sampled it, and the limits that end it."""

    request_id: int
    prompt: Tensor  # [P] int64, on CPU
    limit: int  # new tokens at most
    stops: list[str] = field(default_factory=list)  # stop strings of this request (the engine's, or its own)
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def result(self, reason: FinishReason) -> GenResult:
        return GenResult(
            request_id=self.request_id,
            prompt_ids=self.prompt,
            output_ids=list_tensor(self.output, torch.int64),
            logprobs=list_tensor(self.logprobs, torch.float32),
            versions=list_tensor(self.versions, torch.int32),
            finish_reason=reason,
        )

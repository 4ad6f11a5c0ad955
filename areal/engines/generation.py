"""What every generation engine (torch, vLLM, emulated) takes and gives: a request and a finished completion."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from torch import Tensor

FinishReason = Literal["eos", "length", "stop"]


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

"""Backends behind the generate, compute-logprob and ppo-update nodes.

A node talks to an engine through the two Protocols below; the torch engines satisfy them on
CPU or one GPU. Other backends (vLLM generation, FSDP training) satisfy the same Protocols and
are imported lazily by the node that picks them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from torch import Tensor

from areal.engines.torch_generate import GenRequest, GenResult, TorchGenerationEngine
from areal.engines.torch_train import LossFn, MicroBatch, TorchTrainEngine


class GenerationEngine(Protocol):
    """Continuous-batching generation, stepped by the worker so it can take weights between steps."""

    version: int

    def submit(self, requests: Iterable[GenRequest]) -> None: ...
    def step(self) -> list[GenResult]: ...
    def pending(self) -> int: ...
    def generate(self, requests: Iterable[GenRequest]) -> list[GenResult]: ...
    def update_weights(self, state_dict: dict[str, Tensor], version: int) -> None: ...


class TrainEngine(Protocol):
    """Forward passes for π_prox and optimizer steps for π_θ over one model."""

    version: int

    def sequence_logprobs(self, sequences: Sequence[Tensor], no_grad: bool = True) -> list[Tensor]: ...
    def train_step(
        self,
        sequences: Sequence[Tensor],
        prompt_lens: Sequence[int],
        loss_fn: LossFn,
        extra: dict | None = None,
    ) -> dict[str, float]: ...
    def state_dict(self) -> dict[str, Tensor]: ...
    def load_state_dict(self, state_dict: dict[str, Tensor]) -> None: ...


__all__ = [
    "GenRequest",
    "GenResult",
    "GenerationEngine",
    "LossFn",
    "MicroBatch",
    "TorchGenerationEngine",
    "TorchTrainEngine",
    "TrainEngine",
]

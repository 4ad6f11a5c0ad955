"""Backends behind the generate, compute-logprob and ppo-update nodes, and the choice between them.

A node talks to an engine through the two Protocols below; the torch engines satisfy them on
CPU or one GPU, vLLM generation and FSDP training satisfy the same Protocols. A node asks
`generation_engine` or `train_engine` for the one `RunConfig` names (`generation.engine`,
`trainer.engine`); the backend's module is imported only then. `engine_problems` says, one
sentence each, what this process lacks to run them: the controller asks before any worker
starts, and each factory asks again in the worker (on a Ray cluster only the worker's host counts).

Not here: starting the FSDP ranks of a data-parallel trainer (a trainer process joins the group
torchrun or Ray made, or starts a one-rank group), and the NCCL weights route.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch
from safetensors.torch import load_file
from torch import Tensor

from areal.config import RunConfig
from areal.engines.torch_generate import GenRequest, GenResult, TorchGenerationEngine
from areal.engines.torch_train import LossFn, MicroBatch, TorchTrainEngine
from areal.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class GenerationEngine(Protocol):
    """Continuous-batching generation, stepped by the worker so it can take weights between steps."""

    version: int

    def submit(self, requests: Iterable[GenRequest]) -> None: ...
    def step(self) -> list[GenResult]: ...
    def pending(self) -> int: ...
    def generate(self, requests: Iterable[GenRequest]) -> list[GenResult]: ...
    def update_weights(self, state_dict: dict[str, Tensor], version: int) -> None: ...


class TrainEngine(Protocol):
    """Forward passes for π_prox and optimizer steps for π_θ over one model.

    An engine counts optimizer steps (`step`); the policy version is its trainer node's.
    """

    @property
    def step(self) -> int: ...

    def sequence_logprobs(self, sequences: Sequence[Tensor], no_grad: bool = True) -> list[Tensor]: ...
    def train_step(
        self,
        sequences: Sequence[Tensor],
        prompt_lens: Sequence[int],
        loss_fn: LossFn,
        extra: dict | None = None,
        *,
        loss_reduction: Literal["mean", "sum"] = "mean",
        lr_step: int | None = None,
    ) -> dict[str, float]: ...
    def state_dict(self) -> dict[str, Tensor]: ...
    def load_state_dict(self, state_dict: dict[str, Tensor]) -> None: ...
    def save(self, directory: str | Path, version: int) -> None: ...
    def load(self, directory: str | Path) -> int: ...


# ---- choosing the engine the config names -----------------------------------------------------


def engine_problems(config: RunConfig, *, generation: bool = True, training: bool = True) -> list[str]:
    """What this process lacks to run the configured engines: one sentence each, with the way out.

    Cheap: it looks for packages without importing them and asks torch about devices.
    """
    problems = []
    if generation and config.generation.engine == "vllm":
        missing = []
        if not _has_package("vllm"):
            missing.append("the 'vllm' package (pip install 'areal[gpu]')")
        if not _has_cuda():
            missing.append("a CUDA GPU (this process sees none)")
        if missing:
            them = "them" if len(missing) > 1 else "it"
            problems.append(f'generation.engine="vllm" needs {" and ".join(missing)}; '
                            f'generation.engine="torch" runs without {them}.')
    if training and config.trainer.engine == "fsdp" and not torch.distributed.is_available():
        problems.append('trainer.engine="fsdp" needs a torch built with torch.distributed (this one has none); '
                        'trainer.engine="torch" runs without it.')
    return problems


def require_engines(config: RunConfig, *, generation: bool = True, training: bool = True) -> None:
    """Raise one ConfigError listing `engine_problems`, if there are any."""
    problems = engine_problems(config, generation=generation, training=training)
    if problems:
        raise ConfigError("\n".join(problems))


def generation_engine(config: RunConfig, checkpoint: Path, tokenizer: Any, *, weights: Path | None, version: int,
                      decode: Callable[[list[int]], str]) -> GenerationEngine:
    """The generation engine `config.generation.engine` names, on the checkpoint's model.

    `weights` (a safetensors file of the run's policy, or None) replace the checkpoint's own.
    """
    require_engines(config, training=False)
    gen = config.generation
    common: dict[str, Any] = dict(
        eos_token_id=tokenizer.eos_token_id, max_new_tokens=gen.max_new_tokens, temperature=gen.temperature,
        top_p=gen.top_p, stop_strings=list(gen.stop), decode=decode, seed=config.seed, version=version,
    )
    if gen.engine == "vllm":
        from areal.engines.vllm_generate import VLLMBackend, VLLMGenerationEngine

        backend = VLLMBackend(str(checkpoint), dtype=config.dtype, seed=config.seed, max_num_seqs=gen.max_batch)
        vllm_engine = VLLMGenerationEngine(backend, **common)
        if weights is not None:  # through the update path: the engine is live, nothing is in flight yet
            vllm_engine.update_weights(load_file(str(weights)), version)
        return vllm_engine
    from areal.models.loading import load_model

    model = load_model(checkpoint, dtype=config.dtype)
    if weights is not None:
        model.load_state_dict(load_file(str(weights)))
    return TorchGenerationEngine(model, pad_token_id=tokenizer.pad_token_id, max_batch=gen.max_batch, **common)


def train_engine(config: RunConfig, model: PreTrainedModel) -> TrainEngine:
    """The training engine `config.trainer.engine` names, over `model` (FSDP shards it in place)."""
    require_engines(config, generation=False)
    t = config.trainer
    common: dict[str, Any] = dict(
        lr=t.lr, betas=t.adam_betas, weight_decay=t.weight_decay, grad_clip=t.grad_clip,
        microbatch_tokens=t.microbatch_tokens, warmup_steps=t.warmup_steps, lr_schedule=t.lr_schedule,
        total_steps=config.steps, temperature=config.generation.temperature,
    )
    if t.engine == "fsdp":
        from areal.engines.fsdp_train import FSDPTrainEngine, join_process_group

        return FSDPTrainEngine(model, device_type=join_process_group(), **common)
    return TorchTrainEngine(model, **common)


def _has_package(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _has_cuda() -> bool:
    return torch.cuda.is_available()


__all__ = [
    "GenRequest",
    "GenResult",
    "GenerationEngine",
    "LossFn",
    "MicroBatch",
    "TorchGenerationEngine",
    "TorchTrainEngine",
    "TrainEngine",
    "engine_problems",
    "generation_engine",
    "require_engines",
    "train_engine",
]

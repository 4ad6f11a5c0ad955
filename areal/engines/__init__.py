"""Backends behind the generate, compute-logprob and ppo-update nodes, and the choice between them.

A node talks to an engine through the two Protocols below; the torch engines satisfy them on
CPU or one GPU, vLLM generation and FSDP training satisfy the same Protocols, and so do the
emulated engines (modelled time on an emulated device, no model: `emulated/`). A node asks
`generation_engine` or `train_engine` for the one `RunConfig` names (`generation.engine`,
`trainer.engine`, looked up in `_GENERATION` / `_TRAINING`); the backend's module is imported only
then. `engine_problems` says, one sentence each, what this process lacks to run them: the
controller asks before any worker starts, and each factory asks again in the worker (on a Ray
cluster only the worker's host counts).

Not here: starting the FSDP ranks of a data-parallel trainer (a trainer process joins the group
torchrun or Ray made, or starts a one-rank group), and the NCCL weights route.

May import: areal.kernels, areal.models (and the leaves areal.config, areal.overrides, areal.errors).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import torch
from safetensors.torch import load_file
from torch import Tensor

from areal.config import GenerationConfig, RunConfig
from areal.engines.device import device_problem, torch_device
from areal.engines.generation import GenRequest, GenResult
from areal.engines.torch_generate import TorchGenerationEngine
from areal.engines.training.micro_batch import LossFn, MicroBatch
from areal.engines.training.torch_train import TorchTrainEngine
from areal.engines.training.trainer_settings import TrainSettings
from areal.engines.vllm.api import unsupported
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
    def progress(self) -> dict[int, tuple[int, int]]: ...  # request id -> (tokens so far, oldest token's version)
    def abort(self, request_ids: Iterable[int]) -> dict[int, int]: ...  # request id -> tokens it had, now wasted
    def requeue(self, request_ids: Iterable[int]) -> dict[int, int]: ...  # to the queue's front, with its tokens
    def time_split(self) -> dict[str, float]: ...  # seconds per phase so far; {} where the engine cannot tell


@runtime_checkable
class AdapterEngine(Protocol):
    """A generation engine that serves LoRA adapters itself (vLLM's LoRA requests), so a LoRA policy's published
    adapter reaches it as it came instead of merged into full weights (engines/lora/)."""

    def load_adapter(self, adapter: dict[str, Tensor], version: int) -> None: ...


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
    problems: list[str | None] = []
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
        else:  # a release whose engine API the backend was not checked against (engines/vllm/api.py)
            problems.append(unsupported(_package_version("vllm")))
    if training and config.trainer.engine == "fsdp" and not torch.distributed.is_available():
        problems.append('trainer.engine="fsdp" needs a torch built with torch.distributed (this one has none); '
                        'trainer.engine="torch" runs without it.')
    if generation and config.generation.engine == "torch":
        problems.append(device_problem("generation.device", config.generation.device))
        if config.generation.cuda_graphs == "on" and torch_device(config.generation.device).type != "cuda":
            problems.append(f'generation.cuda_graphs="on" needs the generator on a CUDA GPU (generation.device='
                            f'"{config.generation.device}" is {torch_device(config.generation.device)} here); '
                            'cuda_graphs="auto" decodes eagerly on a CPU.')
    if training and config.trainer.engine != "emulated":
        problems.append(device_problem("trainer.device", config.trainer.device))
    return [p for p in problems if p is not None]


def require_engines(config: RunConfig, *, generation: bool = True, training: bool = True) -> None:
    """Raise one ConfigError listing `engine_problems`, if there are any."""
    problems = engine_problems(config, generation=generation, training=training)
    if problems:
        raise ConfigError("\n".join(problems))


def generation_engine(config: RunConfig, checkpoint: Path | None, tokenizer: Any, *, weights: Path | None,
                      version: int, decode: Callable[[list[int]], str], lora_rank: int = 0) -> GenerationEngine:
    """The generation engine `config.generation.engine` names, on the checkpoint's model.

    `weights` (a safetensors file of the run's policy, or None) replace the checkpoint's own. `lora_rank`: the
    policy publishes LoRA adapters of that rank (an engine that serves adapters itself prepares for them).
    """
    require_engines(config, training=False)
    if lora_rank and config.generation.engine == "vllm":
        return _vllm_generation(config, checkpoint, tokenizer, weights, version, decode, lora_rank)
    return _GENERATION[config.generation.engine](config, checkpoint, tokenizer, weights, version, decode)


def train_engine(config: RunConfig, model: Callable[[], PreTrainedModel]) -> TrainEngine:
    """The training engine `config.trainer.engine` names; `model()` loads the policy when the engine needs one
    (FSDP shards it in place)."""
    require_engines(config, generation=False)
    return _TRAINING[config.trainer.engine](config, model)


def _torch_generation(config: RunConfig, checkpoint: Path | None, tokenizer: Any, weights: Path | None,
                      version: int, decode: Callable[[list[int]], str]) -> GenerationEngine:
    from areal.models.loading import load_model, pad_token_id

    assert checkpoint is not None  # only an emulated device runs without one
    model = load_model(checkpoint, dtype=config.dtype).to(torch_device(config.generation.device))
    if weights is not None:
        model.load_state_dict(load_file(str(weights)))
    return torch_generation_engine(model, config.generation, pad_token_id=pad_token_id(tokenizer),
                                   **_sampling(config, tokenizer, version, decode, checkpoint))


def torch_generation_engine(model: PreTrainedModel, gen: GenerationConfig, **settings: Any) -> GenerationEngine:
    """The torch engine `gen.decode_step` names over `model` (on its device): the fixed decode step when the lean
    forward knows the model, else Hugging Face's forward (said once, on stderr, under decode_step=auto)."""
    settings = dict(max_batch=gen.max_batch, refill_min_free=gen.refill_rows, keep_kv_on_update=gen.keeps_kv,
                    **settings)
    if gen.decode_step != "hf":
        from areal.engines.decode import SlotGenerationEngine, lean_problem

        problem = lean_problem(model)
        if problem is None:
            on_gpu = next(model.parameters()).device.type == "cuda"
            return SlotGenerationEngine(model, graphs=gen.cuda_graphs == "on" or (gen.cuda_graphs == "auto" and on_gpu),
                                        **settings)
        if gen.decode_step == "fixed":
            raise ConfigError(f'generation.decode_step="fixed": {problem}; decode_step="auto" or "hf" decodes it with '
                              "Hugging Face's forward.")
        print(f"areal: generation: {problem}; decoding with Hugging Face's forward (generation.decode_step=auto)",
              file=sys.stderr)
    return TorchGenerationEngine(model, **settings)


def _vllm_generation(config: RunConfig, checkpoint: Path | None, tokenizer: Any, weights: Path | None,
                     version: int, decode: Callable[[list[int]], str], lora_rank: int = 0) -> GenerationEngine:
    from areal.engines.vllm.generate import VLLMBackend, VLLMGenerationEngine

    adapters, lora_args = None, {}
    if lora_rank:  # adapters as LoRA requests, the newest η + 1 versions registered (engines/lora/slots.py)
        import atexit
        import shutil
        import tempfile

        from areal.engines.lora.slots import AdapterSlots, vllm_lora_args

        folder = tempfile.mkdtemp(prefix="areal-lora-")
        atexit.register(shutil.rmtree, folder, True)
        lora_args = vllm_lora_args(lora_rank, config.staleness)
        adapters = AdapterSlots(Path(folder), config.staleness + 1, str(checkpoint))
    backend = VLLMBackend(str(checkpoint), dtype=config.dtype, seed=config.seed,
                          max_num_seqs=config.generation.max_batch, **lora_args)
    engine = VLLMGenerationEngine(backend, **_sampling(config, tokenizer, version, decode, checkpoint),
                                  adapters=adapters)
    if weights is not None:  # through the update path: the engine is live, nothing is in flight yet
        engine.update_weights(load_file(str(weights)), version)
    return engine


def _emulated_generation(config: RunConfig, checkpoint: Path | None, tokenizer: Any, weights: Path | None,
                         version: int, decode: Callable[[list[int]], str]) -> GenerationEngine:
    from areal.engines.emulated.device import DeviceProfile, OutputLengths
    from areal.engines.emulated.generate import EmulatedGenerationEngine

    e = config.emulation
    lengths = OutputLengths(e.output_tokens_median, e.output_tokens_sigma, config.seed)
    return EmulatedGenerationEngine(
        DeviceProfile.load(e.profile), lengths=lengths,
        max_new_tokens=config.generation.max_new_tokens, max_batch=config.generation.max_batch,
        time_scale=e.time_scale, seed=config.seed, version=version, eos_token_id=tokenizer.eos_token_id,
        keep_kv_on_update=config.generation.keeps_kv)


def _sampling(config: RunConfig, tokenizer: Any, version: int, decode: Callable[[list[int]], str],
              checkpoint: Path | None) -> dict[str, Any]:
    from areal.models.chat import uses_chat
    from areal.models.loading import end_token_ids, generation_eos

    gen = config.generation
    listed = generation_eos(checkpoint) if checkpoint is not None else None
    stops = gen.stops(uses_chat(tokenizer, gen.chat_template))
    return dict(**ending(end_token_ids(tokenizer, listed)), max_new_tokens=gen.max_new_tokens,
                temperature=gen.temperature, top_p=gen.top_p, stop_strings=stops, decode=decode,
                seed=config.seed, version=version)


def ending(ends: list[int]) -> dict[str, Any]:
    """An engine's eos_token_id and stop_sequences for the ids that end a completion (`end_token_ids`): the first
    is its eos, each other a one-token stop sequence."""
    return {"eos_token_id": ends[0] if ends else None, "stop_sequences": [[i] for i in ends[1:]] or None}


def _torch_training(config: RunConfig, model: Callable[[], PreTrainedModel]) -> TrainEngine:
    return TorchTrainEngine(model(), train_settings(config), device=torch_device(config.trainer.device))


def _fsdp_training(config: RunConfig, model: Callable[[], PreTrainedModel]) -> TrainEngine:
    from areal.engines.training.fsdp_train import FSDPTrainEngine, join_process_group

    device_type = join_process_group(torch_device(config.trainer.device).type)
    return FSDPTrainEngine(model(), train_settings(config), device=torch.device(device_type))


def _emulated_training(config: RunConfig, model: Callable[[], PreTrainedModel]) -> TrainEngine:
    from areal.engines.emulated.device import DeviceProfile
    from areal.engines.emulated.train import EmulatedTrainEngine

    e = config.emulation
    return EmulatedTrainEngine(DeviceProfile.load(e.profile), time_scale=e.time_scale,
                               gpus_per_rank=e.trainer_gpus_per_rank, ranks=config.trainer.ranks)


# the engine each config value names: a new engine is one module and one line here
_GENERATION: dict[str, Callable[..., GenerationEngine]] = {
    "torch": _torch_generation, "vllm": _vllm_generation, "emulated": _emulated_generation}
_TRAINING: dict[str, Callable[[RunConfig, Callable[[], PreTrainedModel]], TrainEngine]] = {
    "torch": _torch_training, "fsdp": _fsdp_training, "emulated": _emulated_training}


def needs_model(config: RunConfig, *, generation: bool) -> bool:
    """Whether the configured generation (or training) engine loads the policy: an emulated device does not."""
    return (config.generation.engine if generation else config.trainer.engine) != "emulated"


def train_settings(config: RunConfig) -> TrainSettings:
    """The optimizer, schedule and batching settings a training engine takes from the trainer's config."""
    t = config.trainer
    return TrainSettings(lr=t.lr, betas=t.adam_betas, weight_decay=t.weight_decay, grad_clip=t.grad_clip,
                         microbatch_tokens=t.microbatch_tokens, warmup_steps=t.warmup_steps,
                         lr_schedule=t.lr_schedule, total_steps=config.steps,
                         temperature=config.generation.temperature,
                         shared_prefixes=t.shares_prefixes(on_cpu=torch_device(t.device).type == "cpu"),
                         model_dropout=t.model_dropout, token_entropy=True)


def _has_package(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _package_version(name: str) -> str:
    return importlib.metadata.version(name)


def _has_cuda() -> bool:
    return torch.cuda.is_available()


__all__ = [
    "AdapterEngine",
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
    "needs_model",
    "require_engines",
    "torch_generation_engine",
    "train_engine",
]

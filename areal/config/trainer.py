"""The trainer's section: the optimiser, the PPO objective, LoRA and where the trainer runs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, field_validator, model_validator

from areal.config.section import DEVICE_PATTERN, Section


class LoraConfig(Section):
    """LoRA adapters on the trained policy (peft): only they train, and only they travel to the generators."""

    rank: NonNegativeInt = Field(0, description="the adapters' rank r; 0: no LoRA, every weight trains")
    alpha: PositiveFloat = Field(16.0, description="an adapter adds (alpha / rank)·B·A to its base weight")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on each adapter's input while training")
    target_modules: list[str] | str = Field("all-linear", description="the linear layers that get adapters: their "
                                            "names (q_proj, v_proj), or all-linear (every one but the output head)")


class TrainerConfig(Section):
    lr: PositiveFloat = Field(
        3e-4, description="AdamW peak learning rate (the default suits the 0.8 M-param built-in; ~1e-6 for 0.5 B+)")
    adam_betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW (β1, β2)")
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: PositiveFloat = Field(1.0, description="max global grad norm")
    clip_eps: float = Field(0.2, gt=0, lt=1, description="PPO clip ε")
    clip_eps_high: PositiveFloat | None = Field(
        None, description="the clip's upper ε (DAPO's clip-higher: 0.28 beside clip_eps=0.2, so a token's "
        "probability may rise further in a step than it may fall); None: clip_eps on both sides")
    dual_clip: float | None = Field(None, gt=1, description="dual-clip PPO: a token with a negative advantage has its "
                                    "objective floored at dual_clip · A (3.0 in Ye et al. 2020); None: off")
    ratio: Literal["token", "sequence"] = Field(
        "token", description="the clipped ratio π_θ/π_prox: per token (PPO, GRPO), or per sample (GSPO, Zheng et al. "
        "2025: the geometric mean over a sample's trained tokens, clipped as one; its paper's range is far narrower, "
        "clip_eps=3e-4 and clip_eps_high=4e-4, with loss_agg=seq-mean-token-mean)")
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = Field(
        "token-mean", description="how the loss averages: token-mean, every trained token of the batch alike (a long "
        "sample weighs more); seq-mean-token-mean, each sample's mean, then their mean (every sample alike); "
        "seq-mean-token-sum, each sample's sum over generation.max_new_tokens, then their mean (Dr. GRPO: no length "
        "in the weight of a token)")
    kl_coef: float = Field(0.0, ge=0, description="β of a KL loss to a frozen reference (GRPO's: k3 of π_θ against "
                           "π_ref per trained token, with its gradient, a token mean whatever loss_agg); > 0 needs a "
                           "`ref_logp` input from a "
                           "compute_logprob(..., frozen=True, output='ref_logp') node; 0: none")
    entropy_coef: float = Field(0.0, ge=0, description="an entropy bonus: coef · H(π_θ) per trained token, with its "
                                "gradient, is subtracted from the loss (a token mean whatever loss_agg), against a "
                                "policy collapsing onto one answer; 0: none. The entropy is reported either way")
    behav_weight_cap: PositiveFloat | None = Field(5.0, description="cap on π_prox/π_behav; tokens over it are masked")
    truncated: Literal["train", "mask"] = Field(
        "train", description="an output cut at generation.max_new_tokens: train it like any other, or mask every "
        "token of it out of the loss (DAPO's overlong filtering: its reward judged an answer that never ended); "
        "needs the generator's `truncated` output")
    objective: Literal["decoupled", "standard", "decoupled-shortcut"] = Field(
        "decoupled", description="decoupled PPO (AReaL), standard PPO, or decoupled with the proximal shortcut")
    microbatch_tokens: PositiveInt = Field(4096, description="positions one micro-batch may hold: its rows x "
                                           "the longest row (torch engine; FSDP counts real tokens); a sample, "
                                           "prompt and completion, must fit in one, so it must be more than "
                                           "generation.max_new_tokens (checked before the run)")
    shared_prefixes: Literal["auto", "on", "off"] = Field(
        "auto", description="torch engine: sequences that share a prompt (a group's samples) run as one row, the "
        "prompt once and each sample's own tokens masked from the others', so a group's prompt is computed once a "
        "step, not once a sample; the same log-probs and gradients (Qwen2/Llama with sdpa or eager attention; other "
        "models keep a row a sample); auto: on when the trainer runs on the CPU (on an H200 the masked rows kept "
        "SDPA off its fastest kernel: 0.97x a row a sample; docs/benchmarks.md); true/false read as on/off")
    minibatches: PositiveInt = Field(1, description="optimizer steps per batch (PPO minibatches); one version")
    epochs: PositiveInt = Field(1, description="passes over each batch, each of `minibatches` optimizer steps, all "
                                "one version (PPO epochs; GRPO's μ, TRL's num_iterations): from the second pass on "
                                "π_θ has left π_prox and the clip acts; the step's counts add up over the passes")
    reuse_proximal_forward: Literal["auto", "on", "off"] = Field(
        "auto", description="with one minibatch, the update backpropagates through the proximal pass's forward "
        "(the same weights, the same micro-batches) instead of running its own: one forward fewer a step, for "
        "the batch's activations held between the two passes; auto: on when the trainer runs on the CPU (torch "
        "engine)")
    model_dropout: bool = Field(False, description="the model's own dropout (GPT-2's 0.1) acts in the update; off: "
                                "the update's forward is the one the behaviour and proximal log-probs were taken "
                                "with, so a step's ratio to its own weights is 1 and clipping sees only policy change "
                                "(a LoRA adapter's dropout is lora.dropout)")
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

    @field_validator("shared_prefixes", mode="before")
    @classmethod
    def _switch_from_bool(cls, value: object) -> object:
        return ("on" if value else "off") if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _ranks_need_fsdp(self) -> TrainerConfig:
        if self.ranks > 1 and self.engine == "torch":
            raise ValueError(f"ranks={self.ranks} trains data-parallel, which needs engine=fsdp (engine={self.engine})")
        if self.lora.rank and self.engine != "torch":
            raise ValueError(f"lora.rank={self.lora.rank} trains adapters on engine=torch only (engine={self.engine})")
        if self.entropy_coef and self.engine == "emulated":
            raise ValueError(f"entropy_coef={self.entropy_coef}: the emulated engine has no distributions to take an "
                             "entropy of (engine=torch or fsdp)")
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
                 "objective": (self.objective, "decoupled"),
                 # dropout acts only in the update's own forward (the proximal pass runs without it)
                 "model_dropout": (self.model_dropout, False),
                 "lora.dropout": (self.lora.dropout if self.lora.rank else 0.0, 0.0)}
        return [f"{name}={got} (needs {want})" for name, (got, want) in needs.items() if got != want]

    def shares_prefixes(self, on_cpu: bool) -> bool:
        """Whether a group's prompt runs once a row (shared_prefixes), where the model allows it."""
        return self.shared_prefixes == "on" or (self.shared_prefixes == "auto" and on_cpu)

    def reuses_proximal_forward(self, on_cpu: bool) -> bool:
        """Whether the update backpropagates through the proximal pass's forward (reuse_proximal_forward)."""
        wanted = self.reuse_proximal_forward == "on" or (self.reuse_proximal_forward == "auto" and on_cpu)
        return wanted and not self._no_single_proximal_forward()

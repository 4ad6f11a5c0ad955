"""The generators' sections: sampling and the engine (generation), and the emulated device (emulation)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from areal.config.section import DEVICE_PATTERN, Section


class GenerationConfig(Section):
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
    stop: list[str] | None = Field(
        None, description="strings that end a completion (its text is cut before them); None: the training tasks' "
        "own (tasks_stop) for a plain prompt's completion, none for a chat reply (it ends at its turn's end token)")
    tasks_stop: list[str] = Field(
        [], description="set as the run starts: the training tasks' own stop strings (the built-in code tasks end a "
        "function body at the next def, comment, print or blank line; a file of one's own and the math tasks have "
        "none), which end a plain prompt's completion where stop is None; a chat reply is no continuation of its "
        "prompt, so they do not cut it")
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

    def stops(self, chat: bool) -> list[str]:
        """The stop strings a generator uses: the run's `stop`, else the training tasks' own (settled as the run
        starts, graph/settings.py) for a plain prompt; a chat reply (`chat`: prompts go through the chat template)
        ends at its turn's end token, not where a function body would."""
        if self.stop is not None:
            return list(self.stop)
        return [] if chat else list(self.tasks_stop)

    @property
    def refill_rows(self) -> int:
        """Free rows that start a refill: the setting, or a quarter of the batch."""
        return self.refill_min_free or max(1, self.max_batch // 4)


class EmulationConfig(Section):
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

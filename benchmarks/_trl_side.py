"""The TRL half of bench_vs_trl.py: GRPOTrainer on areal's model, tasks, reward and sampling.

    python benchmarks/_trl_side.py SPEC.json RESULT.json

Run as its own process (by bench_vs_trl.py) so its memory is measured alone. SPEC holds the
pinned settings (steps, batch_size, group_size, lr, warmup_steps, adam_beta2, save_interval,
threads, seed, generation); RESULT gets the weights saved every save_interval steps (scored later by
the one evaluator, benchmarks/_one_evaluator.py, as areal's checkpoints are), the step times and the
token counts. Times count from TRL's `on_train_begin` (model loaded), as areal's count from "workers
ready", and leave out the saving.

Two adapters make TRL's generation match areal's: HF `generate` stops at stop strings only when
it is handed the tokenizer, which TRL does not pass, so the model's `generate` is bound to it;
and a row that stopped on a stop string is filled with <pad> up to the longest row, which TRL
would train on (it masks only after <eos>), so trailing pads are dropped.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from _one_evaluator import cut_at_stop
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from areal.data.code_tasks import builtin_code_tasks
from areal.models.loading import load_policy
from areal.nodes.workers.policy import save_weights
from areal.rewards import code_tests


def strip_pads(ids: list[int], pad_id: int) -> list[int]:
    end = len(ids)
    while end and ids[end - 1] == pad_id:
        end -= 1
    return ids[:end]


class StopAwareGRPO(GRPOTrainer):
    """GRPOTrainer whose completions end at areal's stop strings, counting generated tokens."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.generated_tokens = 0
        model = self.model
        model.generate = functools.partial(type(model).generate, model, tokenizer=self.processing_class)

    def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
        completion_ids, logprobs = super()._generate_single_turn(*args, **kwargs)
        pad = self.processing_class.pad_token_id
        completion_ids = [strip_pads(list(ids), pad) for ids in completion_ids]
        self.generated_tokens += sum(len(ids) for ids in completion_ids)
        return completion_ids, logprobs


class SavedVersions(TrainerCallback):
    """The policy's weights every `save_interval` optimizer steps and at the end, each with the training wall time
    it was reached at (its own saving excluded), for the one evaluator of bench_vs_trl.py to score afterwards."""

    def __init__(self, folder: Path, interval: int) -> None:
        self.folder, self.interval = folder, interval
        self.started = 0.0
        self.saving_s = 0.0
        self.step_times: list[float] = []
        self.saved: list[dict[str, Any]] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        now = time.monotonic() - self.started - self.saving_s
        self.step_times.append(now)
        if state.global_step % self.interval == 0 or state.global_step == args.max_steps:
            begun = time.monotonic()
            path = self.folder / f"step-{state.global_step:06d}.safetensors"
            save_weights(model.state_dict(), str(path))
            self.saved.append({"version": state.global_step, "wall_s": now, "weights": str(path)})
            self.saving_s += time.monotonic() - begun


def train_prompts(steps: int, batch_size: int, seed: int) -> list[dict[str, Any]]:
    """The train tasks in the order areal's source hands them out, one per prompt slot."""
    return list(islice(iter(builtin_code_tasks(split="train", seed=seed)), steps * batch_size))


def run(spec: dict[str, Any]) -> dict[str, Any]:
    torch.set_num_threads(int(spec["threads"]))
    gen = spec["generation"]
    stops = list(gen["stop"])
    model, tokenizer = load_policy("builtin:tiny-coder")
    tasks = train_prompts(int(spec["steps"]), int(spec["batch_size"]), int(spec["seed"]))
    dataset = Dataset.from_dict({"prompt": [t["prompt"] for t in tasks], "task_index": list(range(len(tasks)))})
    scorer = code_tests(timeout_s=2.0)
    sandbox_errors = 0

    def code_reward(prompts: list[str], completions: list[str], task_index: list[int], **_: Any) -> list[float]:
        """areal's reward: prompt + completion cut at the stop strings, run against the hidden tests."""
        nonlocal sandbox_errors
        programs = [p + cut_at_stop(c, stops) for p, c in zip(prompts, completions)]
        results = scorer(programs, [tasks[i]["tests"] for i in task_index])
        sandbox_errors += sum(r.reason == "sandbox_error" for r in results)  # areal drops these; TRL cannot
        return [r.reward for r in results]

    samples = int(spec["batch_size"]) * int(spec["group_size"])
    args = GRPOConfig(
        output_dir=str(spec["output_dir"]), max_steps=int(spec["steps"]), seed=int(spec["seed"]),
        per_device_train_batch_size=samples, gradient_accumulation_steps=1, num_generations=int(spec["group_size"]),
        num_iterations=1, beta=0.0, epsilon=0.2, loss_type="dapo", scale_rewards="group",
        mask_truncated_completions=False, learning_rate=float(spec["lr"]), lr_scheduler_type="constant_with_warmup",
        warmup_steps=int(spec["warmup_steps"]), weight_decay=0.0, max_grad_norm=1.0, adam_beta1=0.9,
        adam_beta2=float(spec["adam_beta2"]),
        max_completion_length=int(gen["max_new_tokens"]), temperature=float(gen["temperature"]),
        top_p=float(gen["top_p"]), top_k=0, generation_kwargs={"stop_strings": stops}, shuffle_dataset=False,
        use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=10**9,
        disable_tqdm=True, dataloader_num_workers=0, log_level="warning",
    )
    saver = SavedVersions(Path(spec["output_dir"]) / "weights", int(spec["save_interval"]))
    trainer = StopAwareGRPO(model=model, reward_funcs=code_reward, args=args, train_dataset=dataset,
                            processing_class=tokenizer, callbacks=[saver])
    trainer.train()
    scorer.close()
    return {
        "saved": saver.saved, "step_times": saver.step_times,
        "train_tokens": trainer.generated_tokens, "sandbox_errors": sandbox_errors,
        "trained_samples": samples * len(saver.step_times),
    }


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(run(spec)) + "\n")


if __name__ == "__main__":
    main()

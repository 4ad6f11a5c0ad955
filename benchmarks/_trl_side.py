"""The TRL half of bench_vs_trl.py: GRPOTrainer on areal's model, tasks, reward and sampling.

    python benchmarks/_trl_side.py SPEC.json RESULT.json

Run as its own process (by bench_vs_trl.py) so its memory is measured alone. SPEC holds the
pinned settings (steps, batch_size, group_size, lr, warmup_steps, adam_beta2, eval_interval,
eval_tasks, threads, seed, generation); RESULT gets the eval rounds, the step times and the token
counts. Times count from TRL's `on_train_begin` (model loaded), as areal's count from "workers
ready".

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
from datasets import Dataset
from transformers import GenerationConfig, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from areal.data.code_tasks import builtin_code_tasks
from areal.models.loading import load_policy
from areal.rewards import CodeTests, code_tests


def cut_at_stop(text: str, stops: list[str]) -> str:
    """The text before the first stop string: what areal's reward sees."""
    return text[: min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))]


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


class HeldoutEval(TrainerCallback):
    """pass@1 on the held-out tasks, as areal scores it: one sample per task, all tests must pass.

    Rounds at the start, every `interval` optimizer steps before the last, and at the end, with
    the training sampling settings; its wall time is inside the training loop (TRL has no other
    place for it) and is reported apart.
    """

    def __init__(self, tokenizer: Any, scorer: CodeTests, spec: dict[str, Any]) -> None:
        gen = spec["generation"]
        self.tokenizer = tokenizer
        self.scorer = scorer
        self.stops = list(gen["stop"])
        self.interval = int(spec["eval_interval"])
        self.steps = int(spec["steps"])
        heldout = builtin_code_tasks(split="test", seed=int(spec["seed"]))  # areal's held-out source
        self.tasks = list(islice(iter(heldout), int(spec["eval_tasks"])))
        self.config = GenerationConfig(
            do_sample=True, max_new_tokens=gen["max_new_tokens"], temperature=gen["temperature"],
            top_p=gen["top_p"], top_k=0, stop_strings=self.stops, pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        )
        self.started = 0.0
        self.rounds: list[dict[str, Any]] = []
        self.step_times: list[float] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        self.started = time.monotonic()
        self._evaluate(model, 0)

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        self.step_times.append(time.monotonic() - self.started)
        step = state.global_step
        if self.interval and step % self.interval == 0 and step < self.steps:
            self._evaluate(model, step)

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        self._evaluate(model, state.global_step)

    @torch.no_grad()
    def _evaluate(self, model: Any, version: int) -> None:
        start = time.monotonic()
        was_training = model.training
        model.eval()
        prompts = [self.tokenizer.encode(t["prompt"]) for t in self.tasks]
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=self.config,
                             tokenizer=self.tokenizer)
        completions = [strip_pads(row.tolist(), pad) for row in out[:, width:]]
        texts = [cut_at_stop(self.tokenizer.decode(c, skip_special_tokens=True), self.stops) for c in completions]
        results = self.scorer([t["prompt"] + c for t, c in zip(self.tasks, texts)], [t["tests"] for t in self.tasks])
        passed = sum(1 for r in results if r.reward >= 1.0 - 1e-9)
        model.train(was_training)
        self.rounds.append({"version": version, "wall_s": time.monotonic() - self.started,
                            "pass@1": passed / len(self.tasks), "tokens": sum(len(c) for c in completions),
                            "eval_s": time.monotonic() - start})


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
    evaluator = HeldoutEval(tokenizer, scorer, spec)
    trainer = StopAwareGRPO(model=model, reward_funcs=code_reward, args=args, train_dataset=dataset,
                            processing_class=tokenizer, callbacks=[evaluator])
    trainer.train()
    scorer.close()
    return {
        "rounds": evaluator.rounds, "step_times": evaluator.step_times,
        "train_tokens": trainer.generated_tokens, "sandbox_errors": sandbox_errors,
        "trained_samples": samples * len(evaluator.step_times),
    }


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(run(spec)) + "\n")


if __name__ == "__main__":
    main()

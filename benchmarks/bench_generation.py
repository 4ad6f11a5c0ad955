"""Generation throughput: the torch engine with a decode step of fixed shape against today's, against the arithmetic
it needs, and (older sections) against the bare model forward and `model.generate`.

    python benchmarks/bench_generation.py [--sections recipe host] [--repeat 2]
    python benchmarks/bench_generation.py --sections fixed tails groups updates refills   # [1]-[5], today's engine

recipe (#59). The code recipe's shape: the shipped tiny coder, the built-in training prompts as a run tokenises
   them, each shared by a group of 8, the recipe's sampling (48 new tokens, temperature 1, its stop strings), a
   queue of 8 requests a row, a refill at a quarter of the rows, at 64, 128 and 256 rows. Today's engine (Hugging
   Face's forward over a left-padded cache, generation.decode_step=hf) and the fixed step (decode_step=fixed) run
   the same requests and seed one after the other in this process: tokens per CPU second, and whether they drew
   the same tokens. The limit: one thread's GEMM rate measured here at the step's shapes (every matrix of a
   decode step at that many rows), over the FLOPs a token needs (2 × the weights it passes through, plus attention
   over the run's mean context). Target: >= 3x today's at 128 rows, >= 35 % of the limit.
host (#59). The model replaced by a stub that returns logits at once (its cache kept as HF's would be, grown a
   column a call, for today's engine): host CPU time per decode step and per refill at 64/128/256 rows, prompts of
   32 and of 256 tokens. Target: the fixed step's host time per step independent of the cache's length.
1. Engine overhead: 16 requests of the same length, so the batch never changes: engine tokens/s
   against a bare loop of cached forward passes with argmax (no sampling, no bookkeeping) at the
   same batch. Target: overhead <= 15%.
2. Heavy-tailed lengths: the same prompts and output lengths (Pareto-tailed, capped) through the
   engine with continuous refill and through transformers' `model.generate` in batches of 16,
   where a logits processor forces eos at each request's length so both produce the same tokens
   count. Target: engine / generate >= 1.5x. Also the engine at other refill thresholds.
3. GRPO groups: the same requests, each prompt shared by a group of `--group` (as the recipes draw
   them), through the engine and through the engine reading every newcomer's prompt in a forward of
   its own (the engine before its prompt cache): what copying a read prompt's rows saves.
4. The code recipe's shape (GRPO groups of `--group`, prompts of 30-36 tokens, outputs of 8-30) with a
   queue that never empties (a generator at η > 1 holds more samples than rows), 128 rows, new weights
   every 40 or 16 decode steps: the engine re-reading each distinct prompt once and every output over
   a copy, against every running row re-reading its prompt and output whole (the engine before).
5. The same requests: the refill started at 1, 16, 32 or 64 free rows, with and without new weights.

[1]-[5]: today's engine, a random-weight Qwen2 of ~1.4 M params. One intra-op thread throughout; times are process
CPU seconds (best of --repeat runs): on a shared machine wall time mostly measures the neighbours.
"""

from __future__ import annotations

import argparse
import gc
import math
import time
from collections.abc import Callable
from typing import Any

import torch
import transformers

from areal.engines import GenRequest, GenResult, TorchGenerationEngine
from areal.engines.kv_rows import left_padded

VOCAB, EOS, PAD, BATCH = 256, 1, 0, 16


def build_model() -> transformers.Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=768,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    return transformers.Qwen2ForCausalLM(config).eval()


def best_time(fn: Callable[[], object], repeat: int) -> float:
    """Least CPU seconds over `repeat` runs: with one thread it is the wall time an idle core would
    take, and it does not count the time other processes on a shared machine hold the core."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return min(times)


def prompts(n: int, g: torch.Generator, lo: int = 8, hi: int = 32) -> list[list[int]]:
    return [
        torch.randint(2, VOCAB, (int(torch.randint(lo, hi + 1, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


def tail_lengths(n: int, g: torch.Generator, max_len: int, scale: float = 8.0) -> list[int]:
    """Output lengths from a Pareto(alpha=1.2) scaled by `scale`, capped at max_len: most short, a few long."""
    u = torch.rand(n, generator=g)
    return [min(max_len, math.ceil(scale / float(x) ** (1 / 1.2))) for x in u]


@torch.no_grad()
def bare_forward(model: torch.nn.Module, batch: list[list[int]], new_tokens: int) -> None:
    """Prefill then `new_tokens - 1` cached single-token forwards with argmax: the floor any engine pays."""
    ids = torch.tensor(batch, device=model.device)
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    for _ in range(new_tokens - 1):
        out = model(input_ids=token, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)


class ForceEosAt(transformers.LogitsProcessor):
    """Make row i emit eos as its lengths[i]-th new token, so `generate` stops rows where the engine does."""

    def __init__(self, prompt_width: int, lengths: list[int]) -> None:
        self.prompt_width, self.lengths = prompt_width, torch.tensor(lengths)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        produced = input_ids.shape[1] - self.prompt_width
        rows = (self.lengths == produced + 1).to(scores.device)
        scores[rows] = -math.inf
        scores[rows, EOS] = 0.0
        scores[~rows, EOS] = -math.inf  # and never earlier
        return scores


@torch.no_grad()
def hf_generate(model: torch.nn.Module, batch_prompts: list[list[int]], lengths: list[int], batch: int = BATCH) -> None:
    for start in range(0, len(batch_prompts), batch):
        chunk, chunk_lengths = batch_prompts[start : start + batch], lengths[start : start + batch]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), PAD)
        mask = torch.zeros(len(chunk), width, dtype=torch.int64)
        for i, p in enumerate(chunk):
            ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1
        model.generate(
            input_ids=ids.to(model.device),
            attention_mask=mask.to(model.device),
            do_sample=True,
            top_k=0,
            max_new_tokens=max(chunk_lengths),
            logits_processor=transformers.LogitsProcessorList([ForceEosAt(width, chunk_lengths)]),
            eos_token_id=EOS,
            pad_token_id=PAD,
        )


def engine_run(model: torch.nn.Module, batch_prompts: list[list[int]], lengths: list[int], refill: int,
               batch: int = BATCH) -> None:
    engine = TorchGenerationEngine(model, eos_token_id=EOS, pad_token_id=PAD, max_batch=batch, refill_min_free=refill)
    results = engine.generate(
        [GenRequest(i, p, n) for i, (p, n) in enumerate(zip(batch_prompts, lengths, strict=True))]
    )
    assert [len(r.output_ids) for r in results if r.finish_reason == "length"] == [
        n for r, n in zip(results, lengths, strict=True) if r.finish_reason == "length"
    ]


class EveryPromptRead(TorchGenerationEngine):
    """The engine before its prompt cache: every newcomer reads its prompt in the refill's forward."""

    def _prefill(self, admit: list) -> list:
        return self._prefill_forward(admit)


class EveryRowReread(TorchGenerationEngine):
    """The engine before its shared-prompt rebuild: after new weights every running row re-reads its prompt and
    its output in one forward, a group's prompt once per row."""

    def _rebuild(self, rows: list) -> None:
        self._stale = False
        self._set_rows([], None, self._mask[:0, :0])
        if rows:
            ids, mask = left_padded([s.tokens()[:-1] for s in rows], self.pad_token_id)
            _, cache = self._forward(ids, mask, (mask.cumsum(1) - 1).clamp(min=0), None)
            self._set_rows(rows, cache, mask, torch.tensor([s.output[-1] for s in rows]), mask.sum(1))


def grouped_run(engine_class: type[TorchGenerationEngine], model: torch.nn.Module, batch_prompts: list[list[int]],
                lengths: list[int], group: int) -> None:
    engine = engine_class(model, eos_token_id=EOS, pad_token_id=PAD, max_batch=2 * BATCH)
    engine.generate([GenRequest(i, batch_prompts[i // group], n) for i, n in enumerate(lengths)])


@torch.no_grad()
def full_queue_run(engine_class: type[TorchGenerationEngine], model: torch.nn.Module, batch_prompts: list[list[int]],
                   lengths: list[int], group: int, refill: int, every: int,
                   rows: int = 8 * BATCH) -> tuple[TorchGenerationEngine, list[GenResult]]:
    """Every request queued at once (what a generator holds at η > 1: more samples than rows), a refill once
    `refill` rows are free, new weights (the same tensors) every `every` decode steps (0: never); the engine, to
    read its time, and the results."""
    engine = engine_class(model, eos_token_id=EOS, pad_token_id=PAD, max_batch=rows, refill_min_free=refill)
    engine.submit([GenRequest(i, batch_prompts[i // group], n) for i, n in enumerate(lengths)])
    weights, results, steps = model.state_dict(), [], 0
    while engine.pending():
        results += engine.step()
        steps += 1
        if every and steps % every == 0:
            engine.update_weights(weights, engine.version + 1)
    return engine, results


def timed_full_queue(engine_class: type[TorchGenerationEngine], model: torch.nn.Module, batch_prompts: list[list[int]],
                     lengths: list[int], group: int, refill: int, every: int, repeat: int) -> tuple[float, str]:
    """Least CPU seconds of `full_queue_run` over `repeat` runs, and the last run's engine time per phase."""
    engines: list[TorchGenerationEngine] = []
    spent = best_time(lambda: engines.append(full_queue_run(engine_class, model, batch_prompts, lengths, group,
                                                            refill, every)[0]), repeat)
    split = engines[-1].time_split()
    return spent, " · ".join(f"{phase} {t / sum(split.values()):.0%}" for phase, t in split.items())


def legacy(args: argparse.Namespace) -> None:
    """Sections [1]-[5]: today's engine (Hugging Face's forward) on a random-weight model."""
    model = build_model()
    n_params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(0)
    print(f"Qwen2 random init, {n_params / 1e6:.2f} M params, vocab {VOCAB}, 1 torch thread, batch {BATCH}, CPU time")

    # the requests of each section, drawn whatever runs: any subset sees the same ones
    new_tokens = 128
    fixed = [p[:16] for p in prompts(BATCH, g, lo=16, hi=16)]
    batch_prompts = prompts(args.requests, g)  # [2] and [3]'s
    lengths = tail_lengths(args.requests, g, args.max_len)
    queued = 64 * BATCH  # [4] and [5]'s
    recipe_prompts = prompts(queued // args.group, g, lo=30, hi=36)  # ~33 tokens, outputs of 8-30, as the recipe's
    recipe_lengths = torch.randint(8, 31, (queued,), generator=g).tolist()
    if "fixed" in args.sections:
        fixed_batch(model, fixed, new_tokens, args.repeat)
    if "tails" in args.sections:
        tails(model, batch_prompts, lengths, args.repeat)
    if "groups" in args.sections:
        groups(model, batch_prompts, lengths, args.group, args.repeat)
    if "updates" in args.sections:
        updates(model, recipe_prompts, recipe_lengths, args.group, args.repeat)
    if "refills" in args.sections:
        refills(model, recipe_prompts, recipe_lengths, args.group, args.repeat)


def fixed_batch(model: torch.nn.Module, fixed: list[list[int]], new_tokens: int, repeat: int) -> None:
    bare_s = best_time(lambda: bare_forward(model, fixed, new_tokens), repeat)
    engine = TorchGenerationEngine(model, eos_token_id=VOCAB, pad_token_id=PAD, max_batch=BATCH)
    eng_s = best_time(lambda: engine.generate([GenRequest(i, p, new_tokens) for i, p in enumerate(fixed)]), repeat)
    tokens = BATCH * new_tokens
    print(f"\n[1] fixed batch of {BATCH} x {new_tokens} new tokens")
    print(f"  bare forward + argmax : {tokens / bare_s:8.0f} tok/s")
    overhead = 100 * (1 - bare_s / eng_s)
    print(f"  engine                : {tokens / eng_s:8.0f} tok/s   overhead {overhead:.1f}% (target <= 15%)")



def tails(model: torch.nn.Module, batch_prompts: list[list[int]], lengths: list[int], repeat: int) -> None:
    total = sum(lengths)
    padded = sum(max(lengths[s : s + BATCH]) * len(lengths[s : s + BATCH]) for s in range(0, len(lengths), BATCH))
    print(
        f"\n[2] {len(lengths)} requests, output lengths mean {total / len(lengths):.1f}, "
        f"max {max(lengths)}, {total} tokens (static batches of {BATCH} would decode {padded} slots)"
    )
    hf_s = best_time(lambda: hf_generate(model, batch_prompts, lengths), repeat)
    print(f"  transformers generate      : {total / hf_s:8.0f} tok/s")
    for refill in (1, BATCH // 4, BATCH):
        s = best_time(lambda r=refill: engine_run(model, batch_prompts, lengths, r), repeat)
        label = f"engine, refill at {refill} free" + (" (static)" if refill == BATCH else "")
        print(f"  {label:<27}: {total / s:8.0f} tok/s   {hf_s / s:.2f}x generate")



def groups(model: torch.nn.Module, batch_prompts: list[list[int]], lengths: list[int], group: int,
           repeat: int) -> None:
    total = sum(lengths)
    print(f"\n[3] the same {len(lengths)} output lengths in groups of {group} sharing a prompt, batch {2 * BATCH}")
    every_s = best_time(lambda: grouped_run(EveryPromptRead, model, batch_prompts, lengths, group), repeat)
    cached_s = best_time(lambda: grouped_run(TorchGenerationEngine, model, batch_prompts, lengths, group), repeat)
    print(f"  every prompt read          : {total / every_s:8.0f} tok/s")
    print(f"  a group's prompt read once : {total / cached_s:8.0f} tok/s   {every_s / cached_s:.2f}x")



def updates(model: torch.nn.Module, recipe_prompts: list[list[int]], recipe_lengths: list[int], group: int,
            repeat: int) -> None:
    """[4]: the code recipe's shape, a queue that never empties (a generator at η > 1), 128 rows."""
    rows, queued, tokens = 8 * BATCH, len(recipe_lengths), sum(recipe_lengths)
    print(f"\n[4] {queued} requests queued at once (groups of {group}, prompts of 30-36 tokens, outputs of "
          f"8-30), {rows} rows, a refill at {rows // 4} free: after new weights")
    for every in (40, 16):
        print(f"  new weights every {every} decode steps:")
        whole_s, split = timed_full_queue(EveryRowReread, model, recipe_prompts, recipe_lengths, group,
                                          rows // 4, every, repeat)
        print(f"    every row re-read whole : {tokens / whole_s:8.0f} tok/s   1.00x   {split}")
        once_s, split = timed_full_queue(TorchGenerationEngine, model, recipe_prompts, recipe_lengths, group,
                                         rows // 4, every, repeat)
        print(f"    a prompt read once      : {tokens / once_s:8.0f} tok/s   {whole_s / once_s:.2f}x   {split}")



def refills(model: torch.nn.Module, recipe_prompts: list[list[int]], recipe_lengths: list[int], group: int,
            repeat: int) -> None:
    rows, tokens = 8 * BATCH, sum(recipe_lengths)
    print(f"\n[5] the requests of [4]: the refill started at 1, {rows // 8}, {rows // 4} or {rows // 2} free rows")
    for every in (0, 40):
        print(f"  new weights {f'every {every} decode steps' if every else 'never'}:")
        at_one = 0.0
        for refill in (1, rows // 8, rows // 4, rows // 2):
            spent, split = timed_full_queue(TorchGenerationEngine, model, recipe_prompts, recipe_lengths, group,
                                            refill, every, repeat)
            at_one = at_one or spent
            print(f"    refill at {refill:>3} free: {tokens / spent:8.0f} tok/s   {at_one / spent:.2f}x   {split}")


# ---- #59: the fixed decode step against today's engine and against the arithmetic a token needs ---------------

LEGACY = ("fixed", "tails", "groups", "updates", "refills")


def recipe_requests(tokenizer: Any, rows: int, group: int = 8) -> list[GenRequest]:
    """8 requests a row: the built-in training prompts as a run encodes them, each shared by `group` requests."""
    from areal.data import builtin_code_tasks
    from areal.models.chat import encode_prompt

    tasks = builtin_code_tasks("train").tasks
    encoded = [encode_prompt(tokenizer, tasks[i % len(tasks)]["prompt"], False) for i in range(rows)]
    return [GenRequest(i, encoded[i // group]) for i in range(8 * rows)]


def recipe_engine(kind: str, model: torch.nn.Module, tokenizer: Any, rows: int) -> Any:
    """The engine a run builds for generation.decode_step=`kind` (hf: today's; fixed: the decode step of fixed shape),
    with the recipe's sampling and a refill at a quarter of the rows."""
    from areal.config import GenerationConfig
    from areal.engines import torch_generation_engine

    gen = GenerationConfig(max_batch=rows, decode_step=kind)
    return torch_generation_engine(model, gen, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                                   max_new_tokens=gen.max_new_tokens, temperature=gen.temperature, top_p=gen.top_p,
                                   stop_strings=list(gen.stop), seed=0,
                                   decode=lambda ids: str(tokenizer.decode(ids, skip_special_tokens=True)))


def step_shapes(model: torch.nn.Module) -> list[tuple[int, int]]:
    """(in, out) of every matrix a decode step multiplies by, in order: per layer q/k/v, o, gate/up, down; the head."""
    c = model.config
    d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    h, qkv = c.hidden_size, (c.num_attention_heads + 2 * c.num_key_value_heads) * d
    layer = [(h, qkv), (c.num_attention_heads * d, h), (h, 2 * c.intermediate_size), (c.intermediate_size, h)]
    return layer * c.num_hidden_layers + [(h, c.vocab_size)]


def gemm_rate(shapes: list[tuple[int, int]], rows: int, seconds: float = 0.5) -> float:
    """FLOP per CPU second of one thread multiplying `rows` rows through `shapes`, as a decode step does."""
    weights = [torch.randn(n_out, n_in) for n_in, n_out in shapes]
    inputs = [torch.randn(rows, n_in) for n_in, _ in shapes]
    flops = sum(2 * rows * n_in * n_out for n_in, n_out in shapes)
    best = math.inf
    for _ in range(3):  # best of three bursts: the core's rate, not its neighbours'
        count, start = 0, time.process_time()
        while time.process_time() - start < seconds / 3:
            for x, w in zip(inputs, weights, strict=True):
                torch.nn.functional.linear(x, w)
            count += 1
        best = min(best, (time.process_time() - start) / count)
    return flops / best


def recipe_table(model: torch.nn.Module, tokenizer: Any, repeat: int, rows_list: tuple[int, ...] = (64, 128, 256),
                 ) -> dict[int, dict]:
    """Print the table; its rows by row count: tokens per CPU second of each engine, the limit, same tokens."""
    c = model.config
    d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    weights = sum(n_in * n_out for n_in, n_out in step_shapes(model))
    print(f"\n[recipe] the shipped tiny coder ({sum(p.numel() for p in model.parameters()) / 1e6:.2f} M params), the "
          "built-in training prompts in groups of 8, 8 requests a row, 48 new tokens, the recipe's stop strings; "
          "tokens per CPU second, one thread")
    print(f"  {'rows':>4} {'today':>8} {'fixed':>8} {'fixed/today':>11} {'GEMM GFLOP/s':>12} {'limit':>8} "
          f"{'today %':>7} {'fixed %':>7}  same tokens")
    table = {}
    for rows in rows_list:
        requests = recipe_requests(tokenizer, rows)
        runs: dict[str, tuple[float, list[GenResult]]] = {}
        rate = 0.0
        for _ in range(repeat):  # interleaved, best of `repeat` each (the GEMMs too): the neighbours load all alike
            rate = max(rate, gemm_rate(step_shapes(model), rows))
            for kind in ("hf", "fixed"):
                engine = recipe_engine(kind, model, tokenizer, rows)
                start = time.process_time()
                results = engine.generate(requests)
                spent = time.process_time() - start
                if kind not in runs or spent < runs[kind][0]:
                    runs[kind] = (spent, results)
        today, fixed = runs["hf"][1], runs["fixed"][1]
        tokens = sum(len(r.output_ids) for r in fixed)
        same = all(torch.equal(a.output_ids, b.output_ids) for a, b in zip(today, fixed, strict=True))
        # attention's FLOPs at the mean context a token was drawn at: 2 (QK, PV) x 2 x heads x d a column
        context = sum(len(r.prompt_ids) * len(r.output_ids) + len(r.output_ids) ** 2 / 2 for r in fixed) / tokens
        per_token = 2 * weights + 4 * c.num_hidden_layers * c.num_attention_heads * d * context
        limit = rate / per_token
        rates = {kind: tokens / spent for kind, (spent, _) in runs.items()}
        print(f"  {rows:>4} {rates['hf']:>8.0f} {rates['fixed']:>8.0f} {rates['fixed'] / rates['hf']:>10.2f}x "
              f"{rate / 1e9:>12.1f} {limit:>8.0f} {100 * rates['hf'] / limit:>6.1f}% "
              f"{100 * rates['fixed'] / limit:>6.1f}%"
              f"  {'yes' if same else 'NO'} ({tokens} tokens, {per_token / 1e6:.2f} MFLOP a token)")
        table[rows] = {"tokens_per_cpu_s": rates, "limit": limit, "same_tokens": same, "tokens": tokens}
    return table


class _StubForward:
    """The lean forward's place in the fixed step, returning fixed logits at once (K/V never written)."""

    def __init__(self, config: Any, logits: torch.Tensor) -> None:
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.num_layers, self.dtype, self.device = config.num_hidden_layers, torch.float32, torch.device("cpu")
        self.logits = logits

    def reserve(self, columns: int) -> None:
        pass

    def refresh(self) -> None:
        pass

    def decode(self, kv, tokens, positions, width, shared=None, slots=None):  # noqa: ANN001, ANN201 (the Forward Protocol)
        return self.logits[: tokens.shape[0]]

    def extend(self, kv, slots, ids, starts, lengths):  # noqa: ANN001, ANN201
        return self.logits[: ids.shape[0]]


class _StubModel(torch.nn.Module):
    """Hugging Face's place in today's engine: logits at once, its cache grown a column a call as DynamicCache's."""

    def __init__(self, config: Any, logits: torch.Tensor) -> None:
        super().__init__()
        self.config, self.logits = config, logits
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # a parameter: the engine reads the device from one
        self.shape = (config.num_key_value_heads, config.hidden_size // config.num_attention_heads)

    def forward(self, input_ids, attention_mask, position_ids, use_cache, logits_to_keep, cache=None):  # noqa: ANN001, ANN201
        from types import SimpleNamespace

        rows, width = input_ids.shape
        kv_heads, d = self.shape
        new = torch.zeros(rows, kv_heads, width, d)
        if cache is None:
            cache = SimpleNamespace(layers=[SimpleNamespace(keys=new, values=new)
                                            for _ in range(self.config.num_hidden_layers)])
        else:
            for layer in cache.layers:
                layer.keys, layer.values = torch.cat([layer.keys, new], 2), torch.cat([layer.values, new], 2)
        return SimpleNamespace(logits=self.logits[:rows, None], cache=cache)


def _timed(engine: Any, method: str, spent: list[float]) -> None:
    """Count the calls of engine.method and their CPU seconds into spent = [seconds, calls]."""
    inner = getattr(engine, method)

    def counted(*args: Any) -> Any:
        start = time.process_time()
        try:
            return inner(*args)
        finally:
            spent[0] += time.process_time() - start
            spent[1] += 1

    setattr(engine, method, counted)


def host_table(rows_list: tuple[int, ...] = (64, 128, 256), prompts_list: tuple[int, ...] = (32, 256),
               config: Any = None) -> dict[tuple[int, int], list[float]]:
    """Print the table; its cells by (rows, prompt): today's ms a step and a refill, then the fixed step's."""
    from areal.engines.decode import SlotGenerationEngine
    from areal.models.tiny import tiny_coder_config

    config = config or tiny_coder_config()
    table = {}
    print("\n[host] the model a stub that returns logits at once: host CPU time per decode step and per refill (ms); "
          "groups of 8, 16-24 new tokens, 8 requests a row, a refill at a quarter of the rows")
    print(f"  {'rows':>4} {'prompt':>6}   {'today step':>10} {'today refill':>12}   {'fixed step':>10} "
          f"{'fixed refill':>12}")
    g = torch.Generator().manual_seed(0)
    for rows in rows_list:
        logits = torch.randn(rows, config.vocab_size, generator=g)
        for prompt in prompts_list:
            texts = [torch.randint(3, config.vocab_size, (prompt,), generator=g).tolist() for _ in range(rows)]
            requests = [GenRequest(i, texts[i // 8], 16 + i % 9) for i in range(8 * rows)]
            cells = []
            for kind in ("hf", "fixed"):
                settings = dict(eos_token_id=config.vocab_size, pad_token_id=0, max_batch=rows, max_new_tokens=24,
                                refill_min_free=max(1, rows // 4))
                if kind == "hf":
                    engine: Any = TorchGenerationEngine(_StubModel(config, logits), **settings)
                    methods = ("_decode", "_prefill")
                else:
                    engine = SlotGenerationEngine(None, forward=_StubForward(config, logits), **settings)
                    methods = ("_decode", "_admit")
                spent = {m: [0.0, 0] for m in methods}
                for m in methods:
                    _timed(engine, m, spent[m])
                engine.generate(requests)
                cells += [1e3 * spent[m][0] / max(1, spent[m][1]) for m in methods]
            print(f"  {rows:>4} {prompt:>6}   {cells[0]:>10.2f} {cells[1]:>12.2f}   {cells[2]:>10.2f} "
                  f"{cells[3]:>12.2f}")
            table[rows, prompt] = cells
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="+", default=["recipe", "host"], choices=["recipe", "host", *LEGACY])
    parser.add_argument("--requests", type=int, default=64, help="[2], [3]: requests")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--group", type=int, default=8, help="[3]: requests sharing each prompt")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if "recipe" in args.sections:
        from areal.models.loading import load_policy

        model, tokenizer = load_policy("builtin:tiny-coder")
        gc.freeze()  # as a worker does once set up (runtime/worker/main.py): no full collection scans torch's objects
        recipe_table(model, tokenizer, args.repeat)
    if "host" in args.sections:
        host_table()
    if set(args.sections) & set(LEGACY):
        legacy(args)


if __name__ == "__main__":
    main()

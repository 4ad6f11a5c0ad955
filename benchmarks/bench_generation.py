"""Generation throughput: the torch engine vs the bare model forward and vs `model.generate`.

    python benchmarks/bench_generation.py [--requests 64] [--repeat 2]

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

Random-weight Qwen2, ~1.4 M params, one intra-op thread. Times are process CPU seconds (best of
--repeat runs): on a shared machine wall time mostly measures the neighbours.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--group", type=int, default=8, help="[3]: requests sharing each prompt")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = build_model()
    n_params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(0)
    print(f"Qwen2 random init, {n_params / 1e6:.2f} M params, vocab {VOCAB}, 1 torch thread, batch {BATCH}, CPU time")

    # 1. overhead at a fixed batch: same prompt length, same output length, no eos
    new_tokens = 128
    fixed = [p[:16] for p in prompts(BATCH, g, lo=16, hi=16)]
    bare_s = best_time(lambda: bare_forward(model, fixed, new_tokens), args.repeat)
    engine = TorchGenerationEngine(model, eos_token_id=VOCAB, pad_token_id=PAD, max_batch=BATCH)
    eng_s = best_time(lambda: engine.generate([GenRequest(i, p, new_tokens) for i, p in enumerate(fixed)]), args.repeat)
    tokens = BATCH * new_tokens
    print(f"\n[1] fixed batch of {BATCH} x {new_tokens} new tokens")
    print(f"  bare forward + argmax : {tokens / bare_s:8.0f} tok/s")
    overhead = 100 * (1 - bare_s / eng_s)
    print(f"  engine                : {tokens / eng_s:8.0f} tok/s   overhead {overhead:.1f}% (target <= 15%)")

    # 2. heavy-tailed output lengths
    batch_prompts = prompts(args.requests, g)
    lengths = tail_lengths(args.requests, g, args.max_len)
    total = sum(lengths)
    padded = sum(max(lengths[s : s + BATCH]) * len(lengths[s : s + BATCH]) for s in range(0, len(lengths), BATCH))
    print(
        f"\n[2] {args.requests} requests, output lengths mean {total / len(lengths):.1f}, "
        f"max {max(lengths)}, {total} tokens (static batches of {BATCH} would decode {padded} slots)"
    )
    hf_s = best_time(lambda: hf_generate(model, batch_prompts, lengths), args.repeat)
    print(f"  transformers generate      : {total / hf_s:8.0f} tok/s")
    for refill in (1, BATCH // 4, BATCH):
        s = best_time(lambda r=refill: engine_run(model, batch_prompts, lengths, r), args.repeat)
        label = f"engine, refill at {refill} free" + (" (static)" if refill == BATCH else "")
        print(f"  {label:<27}: {total / s:8.0f} tok/s   {hf_s / s:.2f}x generate")

    # 3. the same lengths, each prompt shared by a group
    print(f"\n[3] the same {args.requests} output lengths in groups of {args.group} sharing a prompt, "
          f"batch {2 * BATCH}")
    every_s = best_time(lambda: grouped_run(EveryPromptRead, model, batch_prompts, lengths, args.group), args.repeat)
    cached_s = best_time(lambda: grouped_run(TorchGenerationEngine, model, batch_prompts, lengths, args.group),
                         args.repeat)
    print(f"  every prompt read          : {total / every_s:8.0f} tok/s")
    print(f"  a group's prompt read once : {total / cached_s:8.0f} tok/s   {every_s / cached_s:.2f}x")

    # 4 and 5: the code recipe's shape, a queue that never empties (a generator at η > 1), 128 rows
    rows, queued = 8 * BATCH, 64 * BATCH
    recipe_prompts = prompts(queued // args.group, g, lo=30, hi=36)  # ~33 tokens, outputs of 8-30, as the recipe's
    recipe_lengths = torch.randint(8, 31, (queued,), generator=g).tolist()
    tokens = sum(recipe_lengths)
    print(f"\n[4] {queued} requests queued at once (groups of {args.group}, prompts of 30-36 tokens, outputs of "
          f"8-30), {rows} rows, a refill at {rows // 4} free: after new weights")
    for every in (40, 16):
        print(f"  new weights every {every} decode steps:")
        whole_s, split = timed_full_queue(EveryRowReread, model, recipe_prompts, recipe_lengths, args.group,
                                          rows // 4, every, args.repeat)
        print(f"    every row re-read whole : {tokens / whole_s:8.0f} tok/s   1.00x   {split}")
        once_s, split = timed_full_queue(TorchGenerationEngine, model, recipe_prompts, recipe_lengths, args.group,
                                         rows // 4, every, args.repeat)
        print(f"    a prompt read once      : {tokens / once_s:8.0f} tok/s   {whole_s / once_s:.2f}x   {split}")

    print(f"\n[5] the requests of [4]: the refill started at 1, {rows // 8}, {rows // 4} or {rows // 2} free rows")
    for every in (0, 40):
        print(f"  new weights {f'every {every} decode steps' if every else 'never'}:")
        at_one = 0.0
        for refill in (1, rows // 8, rows // 4, rows // 2):
            spent, split = timed_full_queue(TorchGenerationEngine, model, recipe_prompts, recipe_lengths, args.group,
                                            refill, every, args.repeat)
            at_one = at_one or spent
            print(f"    refill at {refill:>3} free: {tokens / spent:8.0f} tok/s   {at_one / spent:.2f}x   {split}")

if __name__ == "__main__":
    main()

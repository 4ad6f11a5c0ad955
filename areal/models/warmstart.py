"""The supervised warm start of the built-in tiny coder, run once and cached on disk.

A randomly initialised model solves nothing, so RL would have no reward to follow. A short
supervised phase on (prompt, solution) pairs, with the loss on the solution and its <eos> only,
brings the model to where it "almost knows" the tasks: it solves some held-out tasks when sampled
at temperature 1, and RL can sharpen it from there. The steps are deliberately few.

The result is a plain Hugging Face directory (safetensors model, tokenizer config), keyed by a
hash of everything that determines it, written to a temporary directory and renamed into place,
so a reader never sees half a checkpoint. A file lock makes concurrent builders wait for one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from areal.models.cache import cache_root
from areal.models.tokenizer import CharTokenizer

log = logging.getLogger(__name__)

WARMSTART_VERSION = 2  # bump when the training procedure below changes (2: no <eos> between a repair's turns)
BATCH_SIZE = 16
LR = 3e-3
WARMUP_FRACTION = 0.1
DONE_FILE = "warmstart.json"


def default_cache_dir() -> Path:
    """$AREAL_CACHE/warmstart, else ~/.cache/areal/warmstart."""
    return cache_root() / "warmstart"


def cache_key(config: Qwen2Config, tasks: Sequence[Mapping[str, Any]], steps: int, seed: int) -> str:
    """A hash of everything the warm-started weights depend on."""
    config_fields = config.to_dict()
    config_fields.pop("transformers_version", None)
    data = hashlib.sha256()
    for task in tasks:
        data.update(f"{task['prompt']}\0{task['solution']}\0".encode())
        for body, said in task.get("attempts", ()):
            data.update(f"{body}\1{said}\1".encode())
    identity = {
        "config": config_fields,
        "steps": steps,
        "seed": seed,
        "data": data.hexdigest(),
        "version": WARMSTART_VERSION,
        "batch_size": BATCH_SIZE,
        "lr": LR,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def warm_start(
    config: Qwen2Config,
    tasks: Sequence[Mapping[str, Any]],
    steps: int,
    seed: int,
    cache_dir: Path | str | None = None,
) -> Path:
    """The directory of the warm-started model, trained now only if no cached copy exists."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    final = root / cache_key(config, tasks, steps, seed)
    with open(root / f"{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second builder waits here, then finds the result
        if (final / DONE_FILE).exists():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
        try:
            _train_and_save(config, tasks, steps, seed, tmp)
            if final.exists():  # a leftover without DONE_FILE: never complete, safe to replace
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _encode_pairs(tokenizer: CharTokenizer, tasks: Sequence[Mapping[str, Any]]) -> list[tuple[list[int], list[int]]]:
    """(<bos> + prompt, solution + <eos>) ids: the same prompt encoding generation will see.

    A task with `attempts` [(body, feedback), ...] is a repair example: its context is the prompt, then each
    failed body and the feedback after it, as a repair episode's trajectory holds them (the policy reads what
    the agent sent back: a body's <eos> is taken back before the feedback, docs/episodes.md)."""
    pairs = []
    for task in tasks:
        context = tokenizer.encode(task["prompt"])
        for body, said in task.get("attempts", ()):
            context += tokenizer.encode(body, add_special_tokens=False)
            context += tokenizer.encode(said, add_special_tokens=False)
        pairs.append((context, tokenizer.encode(task["solution"], add_special_tokens=False) + [tokenizer.eos_token_id]))
    return pairs


def _batch(pairs: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids, attention mask, and labels that are -100 outside the solutions."""
    width = max(len(p) + len(s) for p, s in pairs)
    ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    labels = torch.full((len(pairs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for row, (prompt, solution) in enumerate(pairs):
        end = len(prompt) + len(solution)
        ids[row, :end] = torch.tensor(prompt + solution)
        labels[row, len(prompt) : end] = torch.tensor(solution)
        mask[row, :end] = 1
    return ids, mask, labels


def _lr_factor(step: int, steps: int) -> float:
    """Linear warmup, then cosine decay to a tenth: the best a fixed small budget can do."""
    warmup = max(1, int(steps * WARMUP_FRACTION))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def _train_and_save(config: Qwen2Config, tasks: Sequence[Mapping[str, Any]], steps: int, seed: int, out: Path) -> None:
    # one thread: on 2 shared cores, 2 threads spin against other processes and ran 8x slower
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _train(config, tasks, steps, seed, out)
    finally:
        torch.set_num_threads(threads)


def _train(config: Qwen2Config, tasks: Sequence[Mapping[str, Any]], steps: int, seed: int, out: Path) -> None:
    if not tasks:
        raise ValueError("warm_start needs at least one task to learn from")
    started = time.perf_counter()
    tokenizer = CharTokenizer()
    pairs = _encode_pairs(tokenizer, tasks)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(step, steps))
    picks = torch.Generator().manual_seed(seed)
    loss = torch.tensor(float("nan"))
    for step in range(steps):
        rows = torch.randint(len(pairs), (BATCH_SIZE,), generator=picks).tolist()
        ids, mask, labels = _batch([pairs[r] for r in rows], tokenizer.pad_token_id)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if (step + 1) % max(1, steps // 10) == 0:
            log.info("warm start step %d/%d, loss %.3f", step + 1, steps, loss.item())
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    record = {"steps": steps, "seed": seed, "final_loss": loss.item(), "seconds": time.perf_counter() - started}
    (out / DONE_FILE).write_text(json.dumps(record, indent=2) + "\n")

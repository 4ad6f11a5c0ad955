"""Helpers for the episode runner's tests: a runner on a small local checkpoint, driven step by step."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from areal.config import RunConfig
from areal.graph.batch import Batch
from areal.graph.meta import GroupMeta
from areal.nodes.episodes.worker import EpisodeRunner, local_runner
from areal.nodes.workers.policy import save_weights
from tests.local_model import make_checkpoint

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def chat_checkpoint(folder: Path) -> Path:
    """A random 1-layer model whose tokenizer is a chat model's: Qwen2's (byte-level BPE, here without merges: one id
    per character), its ChatML template, and its end-of-turn token `<|im_end|>` as eos (the template writes it after
    each assistant turn)."""
    from transformers import Qwen2Tokenizer

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    chars = [chr(c) for c in range(33, 127)] + ["\u0120", "\u010a"]  # byte-level: space is Ġ, newline Ċ
    vocab = {t: i for i, t in enumerate(specials + chars)}
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[], eos_token="<|im_end|>", pad_token="<|endoftext|>",
                               extra_special_tokens=["<|im_start|>"], chat_template=CHATML)
    config = Qwen2Config(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=64, max_position_embeddings=256,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


def runner_on(tmp_path: Path, run: Any, *, outputs: dict | None = None, endpoint: bool = False,
              timeout_s: float | None = None, chat: bool = False, **config: Any) -> EpisodeRunner:
    """An episode runner set up as its worker would, on a random 1-layer model (seed 0) at version 0: the built-in
    char tokenizer's, or with `chat` a chat model's (`chat_checkpoint`)."""
    checkpoint = tmp_path / ("chat-ckpt" if chat else "ckpt")
    if not checkpoint.exists():
        (chat_checkpoint if chat else make_checkpoint)(checkpoint)
    settings = {"model": str(checkpoint), "group_size": 1, "generation": {"max_new_tokens": 8, "stop": []}}
    cfg = RunConfig.model_validate({**settings, **config})
    reports: list = []
    runner = local_runner(run, cfg, outputs=outputs, endpoint=endpoint, timeout_s=timeout_s,
                          report=lambda kind, **fields: reports.append((kind, fields)))
    runner.reports = reports  # type: ignore[attr-defined]
    return runner


def scripted(runner: EpisodeRunner, replies: list[list[int]]) -> list[list[int]]:
    """The runner's policy 'samples' `replies`, one per turn in the order the turns are asked for (log-prob -1.0 each,
    version 0), so a test decides where a reply ends (an <eos>, a stop string); returns the contexts it was asked to
    continue, as they are asked."""
    contexts: list[list[int]] = []

    async def sample(request_id: int, context: list[int], max_new_tokens: int, stop: list[str] | None) -> Any:
        contexts.append(list(context))
        ids = replies[len(contexts) - 1]
        return SimpleNamespace(output_ids=torch.tensor(ids), logprobs=torch.full((len(ids),), -1.0),
                               versions=torch.zeros(len(ids), dtype=torch.int32), finish_reason="stop")

    runner.sampler.sample = sample  # type: ignore[method-assign]
    return contexts


def weights_file(tmp_path: Path, seed: int) -> Path:
    """The state dict of another random model of the same shape: a 'new version' of the policy."""
    folder = make_checkpoint(tmp_path / f"ckpt-{seed}", seed=seed)
    path = tmp_path / f"v-{seed}.safetensors"
    model = AutoModelForCausalLM.from_pretrained(folder)
    save_weights(model.state_dict(), str(path))
    return path


def group(prompts: list[str], group_id: int = 0, samples: int = 1, **fields: list) -> tuple[Batch, GroupMeta]:
    ids = torch.arange(group_id, group_id + len(prompts))
    batch = Batch({"prompt": prompts, **fields, "group_id": ids, "sample_id": ids.clone()})
    return batch, GroupMeta(group=group_id, samples=samples, admitted_at=0)


def run_all(runner: EpisodeRunner, max_steps: int = 10_000) -> list[tuple[Batch, GroupMeta]]:
    done: list[tuple[Batch, GroupMeta]] = []
    for _ in range(max_steps):
        if not runner.pending():
            return done
        done += runner.step()
    raise AssertionError(f"episodes still running after {max_steps} steps")


def token_logprobs(checkpoint_or_weights: tuple[Path, Path | None], ids: list[int]) -> list[float]:
    """log π(ids[t] | ids[:t]) for t >= 1 under the model, at temperature 1."""
    from safetensors.torch import load_file

    folder, weights = checkpoint_or_weights
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    if weights is not None:
        model.load_state_dict(load_file(str(weights)))
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)
    return logp.tolist()

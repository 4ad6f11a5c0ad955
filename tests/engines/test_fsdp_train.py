"""FSDP2 data-parallel training on CPU (gloo, 2 ranks) against the single-process torch engine."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from areal.engines.training.fsdp_train import FSDPTrainEngine, rank_microbatches
from areal.engines.training.step_stats import Peak, Total
from areal.engines.training.torch_train import TorchTrainEngine
from areal.engines.training.trainer_settings import TrainSettings
from tests.spawned import free_port, run_spawned

WORLD = 2
TIMEOUT_S = 120
LENGTHS = [9, 17, 5, 12, 20]  # with a 24-token budget the two ranks get 2 and 1 micro-batches
BUDGET = 24
TOL = 1e-10  # float64 throughout: only the order of the sums differs between the two runs


class _Block(torch.nn.Module):
    """Causal mixing: each position adds a projection of the running mean of the positions up to it."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.mix = torch.nn.Linear(width, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        steps = torch.arange(1, h.shape[1] + 1, dtype=h.dtype)[None, :, None]
        return h + torch.tanh(self.mix(h.cumsum(1) / steps))


class TinyLM(torch.nn.Module):
    """A causal LM shaped like a Hugging Face one (model.layers, tied head, `.logits`) that imports no
    transformers: each spawned rank then starts in ~3 s instead of ~7 s on this shared machine."""

    def __init__(self, seed: int, vocab: int = 100, width: int = 32) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.model = torch.nn.Module()
        self.model.embed = torch.nn.Embedding(vocab, width)
        self.model.layers = torch.nn.ModuleList([_Block(width) for _ in range(2)])
        self.lm_head = torch.nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.model.embed.weight  # tied, like the tiny Qwen2

    def forward(self, input_ids: torch.Tensor, use_cache: bool = False) -> SimpleNamespace:
        h = self.model.embed(input_ids)
        for layer in self.model.layers:
            h = layer(h)
        return SimpleNamespace(logits=self.lm_head(h))


def _batch(seed: int, lengths: list[int]) -> tuple[list[torch.Tensor], list[int], dict]:
    g = torch.Generator().manual_seed(seed)
    sequences = [torch.randint(1, 100, (n,), generator=g) for n in lengths]
    prompt_lens = [max(1, n // 3) for n in lengths]
    return sequences, prompt_lens, {"advantage": torch.randn(len(lengths), generator=g, dtype=torch.float64)}


def _loss(logp, mb):
    """A policy-gradient loss with an entropy bonus, a mean over the micro-batch's tokens, with means, a count and a
    maximum."""
    return -(mb.per_token(mb["advantage"]) * logp + 0.1 * mb["entropy"]).mean(), {
        "logp_mean": logp.detach().mean(), "entropy": mb["entropy"].detach().mean(),
        "below_minus_4": Total(int((logp < -4).sum())),
        "logp_max": Peak(float(logp.detach().max()))}


def _steps(engine) -> list[dict]:
    """Two steps: five sequences (uneven micro-batch counts), then one (a rank with nothing to do)."""
    stats = []
    for seed, lengths in ((1, LENGTHS), (2, [11])):
        sequences, prompt_lens, extra = _batch(seed, lengths)
        stats.append(engine.train_step(sequences, prompt_lens, _loss, extra))
    return stats


SETTINGS = TrainSettings(lr=1e-2, grad_clip=1.0, microbatch_tokens=BUDGET, token_entropy=True)


def _rank_main(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=TIMEOUT_S))
    try:
        engine = FSDPTrainEngine(TinyLM(0).double(), SETTINGS)
        stats = _steps(engine)
        logps = engine.sequence_logprobs(_batch(3, LENGTHS)[0])
        weights = engine.state_dict()
        engine.load_state_dict(TinyLM(0).double().state_dict())  # full weights back into the shards
        reloaded = engine.state_dict()
        if rank == 0:
            save_file({k: v.contiguous() for k, v in reloaded.items()}, f"{out}/reloaded.safetensors")
            save_file({k: v.contiguous() for k, v in weights.items()}, f"{out}/weights.safetensors")
            save_file({str(i): t.contiguous() for i, t in enumerate(logps)}, f"{out}/logps.safetensors")
            Path(out, "stats.json").write_text(json.dumps(stats))
        dist.barrier()  # both ranks tear gloo down together: a rank leaving early can abort its peer
    finally:
        dist.destroy_process_group()


def _spawn(out: Path) -> None:
    run_spawned(_rank_main, (free_port(), str(out)), WORLD, TIMEOUT_S, "FSDP ranks")


def test_two_rank_fsdp_steps_equal_the_single_process_steps(tmp_path):
    _spawn(tmp_path)
    reference = TorchTrainEngine(TinyLM(0).double(), SETTINGS)
    ref_stats = _steps(reference)
    ref_logps = reference.sequence_logprobs(_batch(3, LENGTHS)[0])

    weights = load_file(str(tmp_path / "weights.safetensors"))
    expected = reference.state_dict()
    assert weights.keys() == expected.keys()
    moved = max(float((expected[k] - TinyLM(0).double().state_dict()[k]).abs().max()) for k in expected)
    assert moved > 1e-3  # the steps did change the weights
    for name, value in expected.items():
        torch.testing.assert_close(weights[name], value, rtol=0, atol=TOL, msg=name)
    stats = json.loads((tmp_path / "stats.json").read_text())
    for got, want in zip(stats, ref_stats, strict=True):
        for key in ("loss", "logp_mean", "entropy", "below_minus_4", "logp_max", "grad_norm", "lr", "tokens",
                    "sequences"):
            assert got[key] == pytest.approx(want[key], rel=1e-9, abs=1e-12), key
    reloaded = load_file(str(tmp_path / "reloaded.safetensors"))
    for name, value in TinyLM(0).double().state_dict().items():
        torch.testing.assert_close(reloaded[name], value, rtol=0, atol=0, msg=name)
    logps = load_file(str(tmp_path / "logps.safetensors"))
    for i, want in enumerate(ref_logps):
        torch.testing.assert_close(logps[str(i)], want, rtol=0, atol=TOL)


def test_rank_plan_covers_every_sequence_once_within_budget():
    lengths = [9, 17, 5, 12, 20, 3, 3, 8]
    plan = rank_microbatches(lengths, 3, BUDGET)
    flat = sorted(i for share in plan for mb in share for i in mb)
    assert flat == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in mb) <= BUDGET for share in plan for mb in share)
    loads = [sum(lengths[i] for mb in share for i in mb) for share in plan]
    assert max(loads) - min(loads) <= max(lengths)
    assert rank_microbatches([7], 2, BUDGET) == [[[0]], []]


def test_without_a_process_group_the_error_says_what_to_do():
    with pytest.raises(RuntimeError, match="torch.distributed is not initialised.*or use TorchTrainEngine"):
        FSDPTrainEngine(TinyLM(0))

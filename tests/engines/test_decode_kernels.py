"""The CPU decode kernels (C, float32) against the lean forward's torch ops: the same logits and the same cache."""

from __future__ import annotations

import pytest
import torch

from areal.engines.decode import LeanForward, cpu_kernels
from areal.engines.decode.cpu_kernels import Shared
from areal.engines.decode.slots import SlotKV

pytestmark = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C compiler to build the CPU decode kernels")


def pair(make_model) -> tuple[LeanForward, LeanForward, SlotKV, SlotKV]:
    """The same float32 model through the kernels and through torch ops, each over its own 4-slot cache."""
    forwards = [LeanForward(make_model(0), kernels=use) for use in (True, False)]
    caches = []
    for lean in forwards:
        lean.reserve(64)
        caches.append(SlotKV(layers=lean.num_layers, kv_heads=lean.kv_heads, head_dim=lean.head_dim, slots=4,
                             dtype=lean.dtype, device=lean.device, columns=64))
    assert forwards[0].kernels is not None and forwards[1].kernels is None
    return forwards[0], forwards[1], caches[0], caches[1]


def test_a_prefill_and_decode_steps_through_the_kernels_match_the_torch_ops(make_model):
    fast, plain, fast_cache, plain_cache = pair(make_model)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 100, (3, 11), generator=g)
    lengths, slots = torch.tensor([11, 4, 7]), torch.tensor([2, 0, 3])  # slot 1 stays free
    with torch.no_grad():
        a = fast.extend(fast_cache.kv, slots, ids, torch.zeros(3, dtype=torch.int64), lengths)
        b = plain.extend(plain_cache.kv, slots, ids, torch.zeros(3, dtype=torch.int64), lengths)
        assert (a - b).abs().max() < 1e-5
        positions = torch.tensor([4, 0, 11, 7])  # slot 1 free: it decodes at column 0, ignored
        for _ in range(4):
            tokens = torch.randint(1, 100, (4,), generator=g)
            a = fast.decode(fast_cache.kv, tokens, positions, int(positions.max()) + 1)
            b = plain.decode(plain_cache.kv, tokens, positions, int(positions.max()) + 1)
            assert (a[[0, 2, 3]] - b[[0, 2, 3]]).abs().max() < 1e-5
            positions[[0, 2, 3]] += 1
    filled = [(0, 8), (2, 15), (3, 11)]  # each live slot's columns
    for slot, columns in filled:
        assert (fast_cache.kv[:, :, slot, :, :columns] - plain_cache.kv[:, :, slot, :, :columns]).abs().max() < 1e-5


@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "torch-ops"])
def test_a_step_over_the_running_slots_alone_gives_their_logits_and_leaves_a_free_slot_as_it_was(make_model, kernels):
    fast, plain, fast_cache, plain_cache = pair(make_model)
    lean, cache = (fast, fast_cache) if kernels else (plain, plain_cache)
    ids = torch.randint(1, 100, (4, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        lean.extend(cache.kv, torch.arange(4), ids, torch.zeros(4, dtype=torch.int64), torch.tensor([9, 5, 7, 3]))
        whole = cache.kv.clone()
        tokens, positions = torch.tensor([4, 8, 15, 16]), torch.tensor([9, 5, 7, 3])
        every = lean.decode(whole, tokens, positions, 10)  # slot 1 decoded too
        running = torch.tensor([0, 2, 3])  # slot 1 freed: a step over the others
        before = cache.kv[:, :, 1].clone()
        alone = lean.decode(cache.kv, tokens[running], positions[running], 10, None, running)
    assert (alone - every[running]).abs().max() < 1e-5
    assert torch.equal(cache.kv[:, :, 1], before)
    assert (cache.kv[:, :, running] - whole[:, :, running]).abs().max() < 1e-5  # their K/V written as the full step's


def test_slots_that_share_a_prompt_read_it_from_one_source_with_the_same_result(make_model):
    fast, _, cache, _ = pair(make_model)
    prompt = torch.tensor([[5, 9, 2, 7, 3, 8]])
    with torch.no_grad():
        fast.extend(cache.kv, torch.tensor([1]), prompt, torch.tensor([0]), torch.tensor([6]))
        cache.copy_rows(1, [0, 3], 6)  # a group of three rows in slots 0, 1, 3
        tokens, positions = torch.tensor([4, 4, 11, 4]), torch.tensor([6, 6, 0, 6])
        own = fast.decode(cache.kv.clone(), tokens, positions, 7)
        shared = Shared(order=torch.tensor([0, 1, 3, 2]), source=torch.tensor([1, 1, 2, 1]),
                        columns=torch.tensor([6, 6, 0, 6]))
        cache.kv[:, :, [0, 3], :, :6] = float("nan")  # only the source's copy may be read
        got = fast.decode(cache.kv, tokens, positions, 7, shared)
    assert torch.isfinite(got[[0, 1, 3]]).all()
    assert (got[[0, 1, 3]] - own[[0, 1, 3]]).abs().max() < 1e-5


def test_without_a_c_compiler_the_lean_forward_says_so_once_and_runs_on_torch_ops(make_model, monkeypatch, capsys):
    cpu_kernels.load.cache_clear()
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(cpu_kernels.shutil, "which", lambda name: None)
    try:
        assert LeanForward(make_model(0)).kernels is None
        assert LeanForward(make_model(0)).kernels is None
    finally:
        cpu_kernels.load.cache_clear()
    assert capsys.readouterr().err.count("the CPU decode kernels need a C compiler (cc or $CC) and found none") == 1

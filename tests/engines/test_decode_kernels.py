"""The CPU decode kernels (C, float32) against the lean forward's torch ops: the same logits and the same cache."""

from __future__ import annotations

import fnmatch
import platform
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from areal.engines.decode import LeanForward, cpu_kernels
from areal.engines.decode.cpu_kernels import Shared
from areal.engines.decode.slots import SlotKV
from areal.engines.decode.step import DecodeStep
from areal.engines.sampling import sample_tokens
from tests.engines.test_decode_lean import same_bits, slot_cache, tiny

pytestmark = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C compiler to build the CPU decode kernels")


def varied(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with its biases and norm weights drawn at random: as initialised they are zeros and ones, which a
    kernel that skips a bias or reads the wrong layer's norm would match."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5 if "norm" in name else torch.randn(p.shape, generator=g))
    return model


def pair(make_model) -> tuple[LeanForward, LeanForward, SlotKV, SlotKV]:
    """The same float32 model through the kernels and through torch ops, each over its own 4-slot cache."""
    fast, plain = (LeanForward(varied(make_model(0)), kernels=use) for use in (True, False))
    assert fast.kernels is not None and plain.kernels is None
    return fast, plain, slot_cache(fast, slots=4, garbage=True), slot_cache(plain, slots=4)


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
    assert same_bits(cache.kv[:, :, 1], before)
    for slot, filled in ((0, 10), (2, 8), (3, 4)):  # their K/V written as the full step's
        assert (cache.kv[:, :, slot, :, :filled] - whole[:, :, slot, :, :filled]).abs().max() < 1e-5


@pytest.mark.parametrize("hidden", [64, 128], ids=["head-dim-16", "head-dim-32"])
@pytest.mark.parametrize("columns", [1, 5, 8, 13, 20])
def test_slots_that_share_a_prompt_read_it_from_one_source_with_the_bits_of_their_own_copies(hidden, columns):
    # the split between the source's columns and a row's own falls anywhere in the kernels' blocks of 8 columns:
    # each column's score and each weighted sum must come out the same either side of it (head dims of 16 and 32
    # take the weighted sum's scalar and vector paths)
    fast = LeanForward(varied(tiny("qwen2", hidden_size=hidden)))
    cache = slot_cache(fast, 4, garbage=True)
    prompt = torch.randint(1, 100, (1, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        fast.extend(cache.kv, torch.tensor([1]), prompt, torch.tensor([0]), torch.tensor([20]))
        cache.copy_rows(1, [0, 3], 20)  # a group of three rows in slots 0, 1, 3
        tokens, positions = torch.tensor([4, 4, 11, 4]), torch.tensor([20, 20, 0, 20])
        own = fast.decode(cache.kv.clone(), tokens, positions, 21)
        shared = Shared(order=torch.tensor([0, 1, 3, 2]), source=torch.tensor([1, 1, 2, 1]),
                        columns=torch.tensor([columns, columns, 0, columns]))
        cache.kv[:, :, [0, 3], :, :columns] = float("nan")  # only the source's copy may be read
        got = fast.decode(cache.kv, tokens, positions, 21, shared)
    assert torch.isfinite(got[[0, 1, 3]]).all()
    assert torch.equal(got[[0, 1, 3]], own[[0, 1, 3]])


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


def test_without_the_kernels_sources_the_lean_forward_says_so_once_and_runs_on_torch_ops(make_model, monkeypatch,
                                                                                          capsys, tmp_path):
    cpu_kernels.load.cache_clear()
    monkeypatch.setattr(cpu_kernels, "SOURCES", tmp_path)  # an install that left them out
    try:
        assert LeanForward(make_model(0)).kernels is None
        assert LeanForward(make_model(0)).kernels is None
    finally:
        cpu_kernels.load.cache_clear()
    assert capsys.readouterr().err.count(f"no C sources in {tmp_path}") == 1


def test_every_kernel_source_is_package_data_an_install_carries():
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's")
    declared = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["areal.engines.decode"]
    package = Path(cpu_kernels.__file__).parent
    sources = [p.relative_to(package).as_posix() for p in cpu_kernels.SOURCES.iterdir()]
    assert {"attention.c", "multiply.c", "step.c", "kernels.h"} <= {Path(s).name for s in sources}
    assert all(any(fnmatch.fnmatch(s, glob) for glob in declared) for s in sources)


def prefill_and_step(lean: LeanForward) -> tuple[torch.Tensor, torch.Tensor, SlotKV]:
    """A prefill of three prompts into slots 2, 0, 3 (slot 1 free), then a step over the running slots alone."""
    cache = slot_cache(lean, slots=4, garbage=True)
    ids = torch.randint(1, 100, (3, 11), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        read = lean.extend(cache.kv, torch.tensor([2, 0, 3]), ids, torch.zeros(3, dtype=torch.int64),
                           torch.tensor([11, 4, 7]))
        step = lean.decode(cache.kv, torch.tensor([7, 9, 3]), torch.tensor([4, 11, 7]), 12, None,
                           torch.tensor([0, 2, 3]))
    return read, step, cache


@pytest.mark.parametrize("kind", ["qwen2", "llama"], ids=["qkv-biases", "no-biases"])
def test_the_layer_loop_in_one_c_call_gives_the_bits_of_the_loop_over_torch_multiplies(monkeypatch, kind):
    one_call = LeanForward(varied(tiny(kind)), packed=False)  # its multiplies through sgemm_, as F.linear's
    assert one_call._gemm is not None  # torch's sgemm_ found on this machine (x86 torch links MKL)
    monkeypatch.setattr(cpu_kernels, "torch_sgemm", lambda: None)
    per_layer = LeanForward(varied(tiny(kind)))
    assert per_layer._gemm is None
    read, step, cache = prefill_and_step(one_call)
    read_b, step_b, cache_b = prefill_and_step(per_layer)
    assert torch.equal(read, read_b) and torch.equal(step, step_b)
    assert same_bits(cache.kv, cache_b.kv)


needs_packed = pytest.mark.skipif(not getattr(cpu_kernels.load(), "panel", 0),
                                  reason="the packed multiplies need AVX-512")


@needs_packed
@pytest.mark.parametrize("kind", ["qwen2", "llama"], ids=["qkv-biases", "no-biases"])
def test_the_layer_loop_over_packed_weights_gives_the_sgemm_loops_results_to_float32_rounding(kind):
    packed, plain = LeanForward(varied(tiny(kind))), LeanForward(varied(tiny(kind)), packed=False)
    assert packed._packed and not plain._packed
    read, step, cache = prefill_and_step(packed)
    read_b, step_b, cache_b = prefill_and_step(plain)
    assert (read - read_b).abs().max() < 1e-5 and (step - step_b).abs().max() < 1e-5
    written = ~cache_b.kv.isnan()
    assert (cache.kv[written] - cache_b.kv[written]).abs().max() < 1e-5 and torch.equal(cache.kv.isnan(), ~written)


@needs_packed
@pytest.mark.parametrize("rows, cols", [(96, 128), (101, 17), (20, 384), (7, 1), (32, 200)])
def test_the_packed_multiply_is_a_float32_product_each_row_the_same_whatever_rows_come_with_it(rows, cols):
    # panels of 32 outputs (a last one partial: 101, 20, 7), tiles of 12, 4 and 1 input rows (13 = 12 + 1), 96
    # rows a block (110 = 96 + 14), with and without a bias
    kernels = cpu_kernels.load()
    g = torch.Generator().manual_seed(rows * cols)
    weight, bias = torch.randn(rows, cols, generator=g), torch.randn(rows, generator=g)
    x = torch.randn(110, cols, generator=g)
    packed = kernels.pack_weight(weight)
    assert packed.shape == (-(-rows // 32), cols, 32)
    for b in (None, bias):
        reference = x.double() @ weight.double().T + (0 if b is None else b.double())
        bound = 4 * cols * 2**-24 * (x.double().abs() @ weight.double().abs().T + (0 if b is None else b.abs()))
        whole = kernels.linear_packed(x, packed, b, rows)
        assert ((whole.double() - reference).abs() <= bound + 1e-30).all()
        for n in (1, 3, 4, 5, 12, 13, 97):
            assert torch.equal(kernels.linear_packed(x[:n], packed, b, rows), whole[:n])
        assert torch.equal(kernels.linear_packed(x[100:101], packed, b, rows), whole[100:101])


@pytest.mark.parametrize("prompts, shortest", [(1, 3), (3, 3), (6, 3), (1, 2), (2, 1)])
def test_a_prefill_goes_on_past_the_last_layers_keys_with_each_prompts_last_token_alone_and_the_same_bits(
        prompts, shortest):
    """Only each prompt's last token is read after a prefill: the last layer writes every token's k and v, then
    runs the rest for those alone. Their outputs and the whole cache are the bits of the chunk run whole, also for
    fewer than four prompts, and for a chunk of fewer than four tokens (sgemm_ rounds fewer than four rows
    otherwise)."""
    lean = LeanForward(varied(tiny("qwen2")))
    assert lean._gemm is not None
    g = torch.Generator().manual_seed(prompts)
    lengths = torch.randint(shortest, shortest + 9 if shortest > 2 else shortest + 1, (prompts,), generator=g)
    ids = torch.cat([torch.randint(1, 100, (int(n),), generator=g) for n in lengths])
    slots = torch.repeat_interleave(torch.arange(prompts), lengths)
    positions = torch.cat([torch.arange(int(n)) for n in lengths])
    last = lengths.cumsum(0) - 1
    whole_cache, kept_cache = (slot_cache(lean, slots=prompts, by_column=True, garbage=True) for _ in range(2))
    with torch.no_grad():
        whole = lean._decode_kernels(whole_cache.kv, ids, positions, 12, None, slots)
        kept = lean._decode_kernels(kept_cache.kv, ids, positions, 12, None, slots, kept=last)
    assert kept.shape == (prompts, 64)
    assert torch.equal(kept, whole[last])
    assert same_bits(kept_cache.kv, whole_cache.kv)


def test_torch_sgemm_is_none_where_torch_exports_none(monkeypatch, tmp_path):
    cpu_kernels.torch_sgemm.cache_clear()
    monkeypatch.setattr(cpu_kernels.torch, "__file__", str(tmp_path / "__init__.py"))  # no lib/libtorch_cpu.so
    try:
        assert cpu_kernels.torch_sgemm() is None
    finally:
        cpu_kernels.torch_sgemm.cache_clear()


def group_step(lean: LeanForward, cache: SlotKV) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts read into slots 2 and 0, slot 0's copied to slots 1 and 3 (a group), then three steps over all four,
    the group's prompt read from slot 0: the prefill's logits and the steps' logits."""
    ids = torch.randint(1, 100, (2, 13), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        read = lean.extend(cache.kv, torch.tensor([2, 0]), ids, torch.zeros(2, dtype=torch.int64),
                           torch.tensor([13, 9]))
        cache.copy_rows(0, [1, 3], 9)
        shared = Shared(order=torch.tensor([0, 1, 3, 2]), source=torch.tensor([0, 0, 2, 0]),
                        columns=torch.tensor([9, 9, 0, 9]))
        positions, steps = torch.tensor([9, 9, 13, 9]), []
        for tokens in ([4, 8, 15, 16], [23, 42, 4, 8], [15, 16, 23, 42]):
            steps.append(lean.decode(cache.kv, torch.tensor(tokens), positions, int(positions.max()) + 1, shared))
            positions += 1
    return read, torch.stack(steps)


@pytest.mark.parametrize("heads, kv_heads, hidden", [(4, 2, 128), (3, 1, 96), (6, 2, 240), (2, 2, 64)],
                         ids=["group-2", "group-3", "head-dim-40", "group-1"])
def test_the_kernels_match_the_torch_ops_for_each_head_shape_and_give_the_same_bits_in_either_cache_layout(
        heads, kv_heads, hidden):
    # head dims of 32 and 40 take the vector paths of scores and weighted, and their tails; a group of three
    # attends as a pair of heads and one alone
    def model() -> torch.nn.Module:
        return varied(tiny("qwen2", num_attention_heads=heads, num_key_value_heads=kv_heads, hidden_size=hidden))

    fast, plain = LeanForward(model()), LeanForward(model(), kernels=False)
    by_column, by_head = slot_cache(fast, 4, by_column=True, garbage=True), slot_cache(fast, 4, garbage=True)
    assert by_column.kv.stride(4) == 2 * kv_heads * fast.head_dim and by_head.kv.stride(4) == fast.head_dim
    read, steps = group_step(fast, by_column)
    read_b, steps_b = group_step(fast, by_head)
    assert torch.equal(read, read_b) and torch.equal(steps, steps_b) and same_bits(by_column.kv, by_head.kv)
    plain_cache = slot_cache(plain, 4)
    read_p, steps_p = group_step(plain, plain_cache)
    assert (read - read_p).abs().max() < 1e-5 and (steps - steps_p).abs().max() < 1e-5
    for slot, filled in ((0, 12), (1, 12), (2, 16), (3, 12)):  # the torch ops' prefill also writes its padding
        assert (by_column.kv[:, :, slot, :, :filled] - plain_cache.kv[:, :, slot, :, :filled]).abs().max() < 1e-5


def four_steps(lean: LeanForward, in_c: bool) -> list[torch.Tensor]:
    """Prompt A read into slot 0 and copied to slot 2, prompt B into slots 1 and 3; two steps over all four (A read
    from slot 0), slot 1 freed, two steps over slots 0, 2 and 3 alone and one over all four (the free slot decoded
    and not advanced): every step's tokens, log-probs and slot state, and the cache."""
    cache = slot_cache(lean, 4, by_column=True, garbage=True)
    step = DecodeStep(lean, cache, temperature=0.8, top_p=1.0)
    assert step.in_c  # the C kernels with the layer loop in C: the engine's eager CPU step is one call
    step.in_c = in_c
    g = torch.Generator().manual_seed(13)
    a, b = torch.randint(1, 100, (1, 9), generator=g), torch.randint(1, 100, (2, 6), generator=g)
    seen = []
    with torch.no_grad():
        lean.extend(cache.kv, torch.tensor([0]), a, torch.zeros(1, dtype=torch.int64), torch.tensor([9]))
        lean.extend(cache.kv, torch.tensor([1, 3]), b, torch.zeros(2, dtype=torch.int64), torch.tensor([6, 6]))
        cache.copy_rows(0, [2], 9)
        uniforms = list(torch.rand(4, 8, dtype=torch.float64, generator=g))
        cache.start([0, 1, 2, 3], [5, 6, 7, 8], [9, 6, 9, 6], [1, 0, 2, 1], uniforms)
        shared = Shared(order=torch.tensor([0, 2, 1, 3]), source=torch.tensor([0, 1, 0, 3]),
                        columns=torch.tensor([9, 0, 9, 0]))
        for _ in range(2):
            seen += [*step(4, int(cache.positions.max()) + 1, shared), cache.pending.clone(),
                     cache.positions.clone(), cache.produced.clone()]
        cache.release([1])
        for slots in (torch.tensor([0, 2, 3]), torch.tensor([0, 2, 3]), None):
            seen += [*step(4, int(cache.positions.max()) + 1, None, slots), cache.pending.clone(),
                     cache.positions.clone(), cache.produced.clone()]
    assert cache.positions[1] == 0  # the free slot, decoded in the last step, stays where it was
    return [*seen, cache.kv.clone()]


def test_the_step_in_one_c_call_gives_the_bits_of_the_forward_the_draw_and_the_update(make_model):
    one_call = four_steps(LeanForward(varied(make_model(0))), in_c=True)
    three_calls = four_steps(LeanForward(varied(make_model(0))), in_c=False)
    assert len(one_call) == len(three_calls) == 26
    assert all(same_bits(x, y) for x, y in zip(one_call, three_calls, strict=True))


@pytest.mark.skipif(platform.machine() != "x86_64" or shutil.which("objdump") is None,
                    reason="reads the built x86-64 code with objdump")
def test_the_built_kernels_keep_their_prefetches():
    # GCC 12 once deleted the kernel's __builtin_prefetch loops as dead code, silently: without them the engine's
    # attention waits on each row's K/V columns (a third more of its time there)
    # (its row loop is attend_rows, which rope_attend and decode_layers call, or rope_attend itself if inlined there)
    library = cpu_kernels.load()._lib._name
    code = "".join(subprocess.run(["objdump", "-d", f"--disassemble={name}", library], capture_output=True,
                                  text=True, check=True).stdout for name in ("attend_rows", "rope_attend"))
    assert "prefetchw" in code and "prefetcht1" in code
    # and the asks for the next multiplies' weights (pull, whose plan ahead_plan reports) are instructions too
    plan = subprocess.run(["objdump", "-d", "--disassemble=ahead_plan", library], capture_output=True, text=True,
                          check=True).stdout
    assert "prefetcht1" in plan


def line_count(address: int, floats: int) -> int:
    return 0 if floats == 0 else -(-(address % 64 + 4 * floats) // 64)


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 128, 1001])
def test_the_next_multiplies_weights_are_asked_for_every_line_once_within_the_loops_first_half(rows):
    # decode_layers asks the L2 for the next multiplies' weights while attention and the activation run (pull, a
    # few lines a row); ahead_plan reports the bytes asked at each row of such a loop
    buffer = torch.empty(200_000)
    for a_at, a_floats, b_at, b_floats in [(0, 128 * 128, 20_000, 768 * 128), (3, 100, 0, 0), (5, 1, 7, 17),
                                           (1, 384 * 128, 50_001, 256 * 128)]:
        a, b = buffer.data_ptr() + 4 * a_at, buffer.data_ptr() + 4 * b_at if b_floats else None
        asked = torch.zeros(rows, dtype=torch.int64)
        cpu_kernels.load()._lib.ahead_plan(a, a_floats, b, b_floats, rows, asked.data_ptr())
        lines, half = line_count(a, a_floats) + line_count(b or 0, b_floats), max(rows // 2, 1)
        assert asked.sum() == 64 * lines
        assert asked[half:].sum() == 0
        assert asked.max() == 64 * -(-lines // half)  # a little each row, not all at once


@pytest.mark.parametrize("vocab, temperature", [(101, 1.0), (101, 0.7), (1000, 1.3)])
def test_the_kernels_draw_the_tokens_of_a_float64_inverse_cdf_with_its_log_probs(vocab, temperature):
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(512, vocab, generator=g) * 3
    u = torch.rand(512, dtype=torch.float64, generator=g)
    u[:3] = torch.tensor([0.0, 0.5, 1 - 2**-24], dtype=torch.float64)  # the first token, a middle, the last one
    logits[2, vocab // 2 :] = -torch.inf  # a row whose upper half can never be drawn, at u near 1
    tokens, logp = cpu_kernels.load().sample_rows(logits, u, temperature)
    reference = torch.log_softmax(logits.double() / temperature, dim=-1)
    cdf = reference.exp().cumsum(-1)
    expected = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp(max=vocab - 1).squeeze(1)
    assert torch.equal(tokens, expected)
    assert (logp.double() - reference.gather(1, tokens[:, None]).squeeze(1)).abs().max() < 3e-6
    assert tokens[0] == 0 and tokens[2] < vocab // 2
    assert torch.equal(tokens, sample_tokens(logits, u, temperature=temperature, top_p=1.0)[0])

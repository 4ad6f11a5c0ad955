"""The slot engine against today's engine, the slots it keeps, and its decode step replayed from captured graphs
(a CUDA graph's logic with the capture faked on the CPU: what a graph would replay is the step run again)."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from areal.engines import GenRequest, GenResult, TorchGenerationEngine
from areal.engines.decode import SlotGenerationEngine
from areal.engines.decode.requests import Request, StopWindows, stop_pattern
from areal.engines.decode.slots import SlotKV
from areal.engines.decode.step import ladder


@pytest.fixture
def garbage_caches(monkeypatch):
    """Every by-column cache an engine allocates holds NaN until a row writes it: that cache is not zeroed, and the
    C kernels must read no column a row did not write (a NaN read would show in every log-prob after it)."""
    allocate = SlotKV._empty

    def filled(self: SlotKV, columns: int) -> torch.Tensor:
        kv = allocate(self, columns)
        return kv.fill_(torch.nan) if self.by_column else kv

    monkeypatch.setattr(SlotKV, "_empty", filled)


def grouped_requests(seed: int = 7, groups: int = 6, group: int = 4) -> list[GenRequest]:
    """GRPO-like requests: `groups` prompts of 2-11 tokens, each shared by `group` requests of 1-24 new tokens."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, 100, (int(torch.randint(2, 12, (1,), generator=g)),), generator=g).tolist()
               for _ in range(groups)]
    return [GenRequest(i, prompts[i // group], int(torch.randint(1, 25, (1,), generator=g)))
            for i in range(groups * group)]


def run_with_updates(engine, old, new, requests: list[GenRequest], at=(5, 11)) -> dict[int, GenResult]:
    """Step to the end; new weights after step at[0], the old ones back after at[1] (versions 5 and 11)."""
    engine.submit(requests)
    done, steps = {}, 0
    while engine.pending():
        done |= {r.request_id: r for r in engine.step()}
        steps += 1
        if steps in at:
            engine.update_weights((new if steps == at[0] else old).state_dict(), steps)
    return done


def assert_same_results(a: dict[int, GenResult], b: dict[int, GenResult], atol: float) -> None:
    assert sorted(a) == sorted(b)
    for i in a:
        assert a[i].output_ids.tolist() == b[i].output_ids.tolist(), f"request {i}"
        assert a[i].versions.tolist() == b[i].versions.tolist() and a[i].finish_reason == b[i].finish_reason
        assert (a[i].logprobs.double() - b[i].logprobs.double()).abs().max() <= atol


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-6), (torch.float32, 2e-5)],
                         ids=["torch-ops", "kernels-by-column"])
@pytest.mark.parametrize("keep_kv", [False, True])
def test_the_same_requests_give_todays_tokens_through_refills_and_weight_updates(make_model, keep_kv, dtype, atol,
                                                                                 garbage_caches):
    old, new = make_model(0).to(dtype), make_model(1).to(dtype)
    requests = grouped_requests()
    engines = [engine_class(copy.deepcopy(old), eos_token_id=5, pad_token_id=0, max_batch=7, refill_min_free=2,
                            top_p=0.9, keep_kv_on_update=keep_kv)
               for engine_class in (TorchGenerationEngine, SlotGenerationEngine)]
    runs = [run_with_updates(engine, old, new, requests) for engine in engines]
    assert engines[1].cache.by_column == (dtype == torch.float32)  # float32: the C kernels and their layout
    assert_same_results(*runs, atol=atol)  # float32 log-probs of logits that agree to rounding
    assert {v for r in runs[1].values() for v in r.versions.tolist()} == {0, 5, 11}  # updates landed mid-run
    assert any(r.finish_reason == "eos" for r in runs[1].values())


def test_a_newcomer_takes_the_lowest_free_slot_and_no_running_row_moves(make_model):
    engine = SlotGenerationEngine(make_model(0), eos_token_id=100, pad_token_id=0, max_batch=4)
    engine.submit([GenRequest(i, [3, 4, 5], n) for i, n in enumerate([3, 9, 4, 9, 9])])
    engine.step()  # 0..3 in slots 0..3 (a token from the prefill, one from the decode); 4 waits
    slot_of = {r.request_id: slot for slot, r in enumerate(engine._rows) if r is not None}
    assert slot_of == {0: 0, 1: 1, 2: 2, 3: 3}
    engine.step()  # 0 ends (3 tokens): slot 0 is free, slot 3 still the highest in use
    assert engine._rows[0] is None and engine.cache.high == 4
    engine.step()  # 4 is admitted into slot 0; 2 ends in this step's decode
    assert [r.request_id if r else None for r in engine._rows] == [4, 1, None, 3]


def test_a_free_slot_among_the_running_ones_is_not_decoded(make_model):
    engine = SlotGenerationEngine(make_model(0), eos_token_id=100, pad_token_id=0, max_batch=4, refill_min_free=4)
    fed: list[list[int] | None] = []  # the slots each decode step was given (None: every slot below high)
    decode, decode_step = engine.forward.decode, engine.forward.decode_step

    def noted(kv, tokens, positions, width, shared=None, slots=None):  # noqa: ANN001, ANN202
        fed.append(None if slots is None else slots.tolist())
        return decode(kv, tokens, positions, width, shared, slots)

    def noted_step(kv, state, n, width, temperature, shared=None, slots=None):  # noqa: ANN001, ANN202
        fed.append(None if slots is None else slots.tolist())
        return decode_step(kv, state, n, width, temperature, shared, slots)

    engine.forward.decode = noted  # type: ignore[method-assign]
    engine.forward.decode_step = noted_step  # type: ignore[method-assign]
    engine.submit([GenRequest(i, [3, 4, 5], n) for i, n in enumerate([3, 9, 2, 9])])
    engine.step()  # all four in slots 0..3, one token from the prefill and one decoded: 2 ends (2 tokens)
    engine.step()  # slots 0, 1 and 3 decoded; 0 ends (3 tokens)
    engine.step()  # slots 1 and 3 alone (no refill under 4 free slots)
    assert fed == [None, [0, 1, 3], [1, 3]]
    assert [len(r.output) for r in engine._rows if r is not None] == [4, 4]


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-6), (torch.float32, 2e-5)],
                         ids=["torch-ops", "kernels-by-column"])
def test_rows_longer_than_the_cache_grow_it_mid_run_and_decode_on_as_today(make_model, dtype, atol, garbage_caches):
    model = make_model(0).to(dtype)
    short = [GenRequest(i, [7, 8, 9], n) for i, n in enumerate((6, 20, 6))]  # row 1 runs while the cache grows
    long = [GenRequest(9, list(range(1, 41)), 60)]  # 100 columns: more than the 64 the cache starts with
    results = []
    for engine_class in (TorchGenerationEngine, SlotGenerationEngine):
        engine = engine_class(model, eos_token_id=100, pad_token_id=0, max_batch=2, max_new_tokens=60)
        engine.submit(short + long)
        done = {}
        while engine.pending():
            done |= {r.request_id: r for r in engine.step()}
        results.append(done)
    assert engine.cache.columns >= 100
    assert engine.cache.by_column == (dtype == torch.float32)  # the C kernels' layout, grown as the other
    assert_same_results(*results, atol=atol)


@pytest.mark.parametrize("move", ["abort", "requeue"])
def test_a_group_goes_on_as_it_would_have_when_the_row_holding_its_prompt_leaves(make_model, move, garbage_caches):
    """With the C kernels a group's rows read its prompt from the one slot that read it; when that row is aborted
    or re-queued, its prompt is copied to a row of the group that stays, which the others then read."""
    model = make_model(0).float()
    prompts = [[5, 9, 2, 7, 3, 8, 6], [4, 4, 1, 9, 2]]
    requests = [GenRequest(i, prompts[i // 4], 14) for i in range(8)]  # 0 and 4 read their group's prompt

    def engine() -> SlotGenerationEngine:
        return SlotGenerationEngine(model, eos_token_id=100, pad_token_id=0, max_batch=8)

    untouched = {r.request_id: r for r in engine().generate(requests)}
    moved = engine()
    assert moved.cache.by_column  # the C kernels, which read a group's prompt from one slot
    moved.submit(requests)
    for _ in range(3):
        moved.step()
    assert moved.prompt_cache_hits == 6  # the other six rows did not read their prompt
    assert (moved.abort if move == "abort" else moved.requeue)([0, 4])
    done = {}
    while moved.pending():
        done |= {r.request_id: r for r in moved.step()}
    assert sorted(done) == (list(range(1, 4)) + list(range(5, 8)) if move == "abort" else list(range(8)))
    assert_same_results(done, {i: untouched[i] for i in done}, atol=1e-5)


def faked_capture(captures: list[int]):
    """A capture that runs the step (the warm-up) and returns a replay that runs it again: on the CPU, what
    replaying a CUDA graph of the step would compute."""
    def capture(run, pool):
        captures.append(1)
        run()
        return run
    return capture


def test_the_step_replayed_at_ladder_sizes_gives_the_eager_tokens_and_captures_each_size_once(make_model):
    old, new = make_model(0).double(), make_model(1).double()
    requests = grouped_requests(seed=3)
    eager = run_with_updates(SlotGenerationEngine(copy.deepcopy(old), eos_token_id=5, pad_token_id=0, max_batch=7,
                                                  refill_min_free=2), old, new, requests)
    captures: list[int] = []
    engine = SlotGenerationEngine(copy.deepcopy(old), eos_token_id=5, pad_token_id=0, max_batch=7, refill_min_free=2,
                                  graphs=True, capture=faked_capture(captures))
    replayed = run_with_updates(engine, old, new, requests)
    assert_same_results(eager, replayed, atol=1e-6)  # padded rows and the whole cache width change nothing
    assert engine._step.sizes == [1, 2, 4, 7] and 2 <= len(captures) <= 4  # each size at most once
    before = len(captures)
    engine.submit([GenRequest(99, list(range(1, 50)), 40)])  # 89 columns: the cache grows, graphs are dropped
    while engine.pending():
        engine.step()
    assert engine.cache.columns >= 89 and len(captures) == before + 1
    with pytest.raises(ValueError, match="a replayed step decodes every slot below n; it takes no `slots`"):
        engine._step(2, 0, None, torch.tensor([1]))  # a graph's shape is fixed: it cannot skip a free slot


def test_the_ladder_pads_a_step_by_at_most_a_third_past_eight_rows():
    assert ladder(7) == [1, 2, 4, 7]
    assert ladder(128) == [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128]
    assert ladder(100) == [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 100]


@pytest.mark.parametrize("capacity", [1 << 16, 5], ids=["remembers-all", "forgets-often"])
def test_stop_windows_answer_as_a_search_of_each_rows_decoded_last_tokens(capacity):
    decoded: list[list[int]] = []

    def decode(ids: list[int]) -> str:  # token i is the i-th letter
        decoded.append(ids)
        return "".join(chr(96 + i) for i in ids)

    windows = StopWindows(decode, capacity=capacity)
    kinds = [(stop_pattern(("ab", "ca")), 2), (stop_pattern(("bbb", "c")), 3)]  # two patterns over the same tokens
    rows = [Request(request_id=i, prompt=torch.tensor([1]), limit=99, uniforms=torch.zeros(0), stop_pattern=pattern,
                    stop_window=width) for i, (pattern, width) in enumerate(kinds * 3)]
    for r in rows[:2]:  # both first draw "c", which only the second's pattern stops at
        r.output.append(3)
        assert windows.holds_stop(r) == (r is rows[1])
    rng = random.Random(3)
    seen = set()  # the (pattern, last tokens) windows the rows reached
    for step in range(80):
        if step == 40:  # a row re-queued: a new request with the output so far, no window yet
            rows[0] = Request(request_id=0, prompt=torch.tensor([1]), limit=99, uniforms=torch.zeros(0),
                              stop_pattern=kinds[0][0], stop_window=2, output=list(rows[0].output))
        for r in rows:
            r.output.append(rng.randint(1, 3))
            window = r.output[-r.stop_window :]
            seen.add((r.stop_pattern, tuple(window)))
            expected = r.stop_pattern.search("".join(chr(96 + i) for i in window)) is not None
            assert windows.holds_stop(r) == expected, (step, r.request_id, window)
    if capacity == 1 << 16:  # each window decoded once, however many rows and steps reached it
        assert len(decoded) == len(seen | {(kinds[0][0], (3,)), (kinds[1][0], (3,))}) < 80 * len(rows) // 10
        assert len(windows._after) > len(seen)  # and rows step from window to window, not by their last tokens
    assert len(windows._ids) <= capacity and len(windows._after) <= capacity  # bounded


def test_slots_taken_and_freed_keep_high_one_past_the_highest_in_use_and_a_freed_slots_state_zero():
    cache = SlotKV(layers=1, kv_heads=1, head_dim=2, slots=9, dtype=torch.float32, device=torch.device("cpu"))
    rng, used = random.Random(3), set()
    for _ in range(200):
        if used and (rng.random() < 0.5 or len(used) == 9):
            freed = rng.sample(sorted(used), rng.randint(1, len(used)))
            cache.release(freed)
            used -= set(freed)
            assert cache.live[freed].eq(0).all() and cache.positions[freed].eq(0).all()
            assert cache.pending[freed].eq(0).all() and cache.produced[freed].eq(0).all()
        else:
            taken = cache.take(rng.randint(1, 9 - len(used)))
            cache.start(taken, [5] * len(taken), [3] * len(taken), [1] * len(taken),
                        [torch.rand(2) for _ in taken])
            used |= set(taken)
            assert cache.live[taken].eq(1).all() and cache.positions[taken].eq(3).all()
        assert cache.high == (max(used) + 1 if used else 0)
        assert cache.live.sum() == len(used)

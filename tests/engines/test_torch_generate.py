from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor

from areal.engines import GenerationEngine, GenRequest, GenResult, TorchGenerationEngine

NEVER = 100  # an eos id outside the 100-token vocabulary: generation ends by length only


def forward_logprobs(model: torch.nn.Module, result: GenResult, temperature: float = 1.0) -> Tensor:
    """log softmax(logits / T) of each output token, from one fresh forward over prompt + output."""
    tokens = torch.cat([result.prompt_ids, result.output_ids])
    with torch.no_grad():
        logits = model(tokens[None]).logits[0]
    logp = torch.log_softmax(logits / temperature, dim=-1)
    start = len(result.prompt_ids) - 1
    return logp[start:-1].gather(1, result.output_ids[:, None]).squeeze(1)


def requests(lengths: list[tuple[int, int]], seed: int = 7) -> list[GenRequest]:
    """One request per (prompt length, max_new_tokens), prompts drawn from ids 1..99."""
    g = torch.Generator().manual_seed(seed)
    return [
        GenRequest(i, torch.randint(1, 100, (p,), generator=g).tolist(), max_new_tokens=n)
        for i, (p, n) in enumerate(lengths)
    ]


HEAVY_TAIL = [(3, 1), (1, 2), (6, 30), (9, 3), (2, 5), (4, 25), (7, 1), (5, 8), (8, 2), (3, 40)]


def test_fixed_seed_reproduces_output_and_another_seed_changes_it(make_model, engine_class):
    model = make_model(0)
    reqs = requests([(4, 20)] * 4)

    def run(seed: int) -> list[list[int]]:
        engine = engine_class(model, eos_token_id=NEVER, pad_token_id=0, max_batch=2, seed=seed)
        return [r.output_ids.tolist() for r in engine.generate(reqs)]

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_logprobs_equal_a_fresh_forward_pass_after_temperature(make_model, engine_class):
    model = make_model(0)
    engine = engine_class(model, eos_token_id=0, pad_token_id=0, temperature=0.7, top_p=0.9, max_batch=4)
    results = engine.generate(requests(HEAVY_TAIL))
    for r in results:
        assert r.logprobs.dtype == torch.float32 and r.versions.dtype == torch.int32
        torch.testing.assert_close(r.logprobs, forward_logprobs(model, r, 0.7), atol=1e-5, rtol=0)


def test_continuous_refill_gives_the_same_completions_as_generating_each_alone(make_model, engine_class):
    model = make_model(0)
    reqs = requests(HEAVY_TAIL)
    alone = [
        engine_class(model, eos_token_id=0, pad_token_id=0, top_p=0.9, max_batch=1).generate([r])[0]
        for r in reqs
    ]
    for refill_min_free in (1, 3):
        engine = engine_class(
            model, eos_token_id=0, pad_token_id=0, top_p=0.9, max_batch=3, refill_min_free=refill_min_free
        )
        engine.submit(reqs)
        done, steps = {}, 0
        while engine.pending():
            done |= {r.request_id: r for r in engine.step()}
            steps += 1
        if refill_min_free == 1:  # (3 waits for the whole batch to drain: static batching)
            assert steps < sum(len(r.output_ids) for r in alone) / 2, "requests should share decode steps"
        for a in alone:
            b = done[a.request_id]
            assert b.output_ids.tolist() == a.output_ids.tolist() and b.finish_reason == a.finish_reason
            torch.testing.assert_close(b.logprobs, a.logprobs, atol=1e-5, rtol=0)


def new_weights_after_four_steps(engine: GenerationEngine, new: torch.nn.Module) -> list[GenResult]:
    """Six requests of 12 tokens on 4 rows; the weights change to `new` (version 1) after 4 steps: requests 0-3
    have sampled 5 tokens each by then (the first step prefills, sampling 1, then decodes 1), 4 and 5 none."""
    engine.submit(requests([(3, 12), (5, 12), (1, 12), (8, 12), (4, 12), (2, 12)]))
    results: list[GenResult] = []
    for _ in range(4):
        results += engine.step()
    engine.update_weights(new.state_dict(), version=1)
    while engine.pending():
        results += engine.step()
    assert sorted(r.request_id for r in results) == list(range(6))
    return results


def test_weight_update_mid_generation_versions_and_logprobs_follow_the_weights(make_model, engine_class):
    old, new = make_model(0), make_model(1)
    engine = engine_class(copy.deepcopy(old), eos_token_id=NEVER, pad_token_id=0, max_batch=4)
    results = new_weights_after_four_steps(engine, new)
    for r in results:
        before = 5 if r.request_id < 4 else 0
        assert r.versions.tolist() == [0] * before + [1] * (12 - before)
        torch.testing.assert_close(r.logprobs[:before], forward_logprobs(old, r)[:before], atol=1e-5, rtol=0)
        torch.testing.assert_close(r.logprobs[before:], forward_logprobs(new, r)[before:], atol=1e-5, rtol=0)
        assert (r.logprobs[before:] - forward_logprobs(old, r)[before:]).abs().max() > 1e-2


def kept_kv_logprobs(old: torch.nn.Module, new: torch.nn.Module, result: GenResult, before: int) -> Tensor:
    """The logprobs of the output tokens after the first `before`, as sampled when the weights changed to `new`
    with the KV that `old` wrote for prompt + output[:before - 1] kept (the last of those was fed after)."""
    tokens = torch.cat([result.prompt_ids, result.output_ids])
    split = len(result.prompt_ids) + before - 1
    with torch.no_grad():
        cache = old(tokens[None, :split], use_cache=True).past_key_values
        logits = new(tokens[None, split:], past_key_values=cache).logits[0]
    return torch.log_softmax(logits, dim=-1)[:-1].gather(1, result.output_ids[before:, None]).squeeze(1)


def test_keeping_the_kv_across_an_update_decodes_on_over_the_old_rows_as_a_float64_forward_would(
        make_model, engine_class):
    old, new = make_model(0).double(), make_model(1).double()
    engine = engine_class(copy.deepcopy(old), eos_token_id=NEVER, pad_token_id=0, max_batch=4,
                                   keep_kv_on_update=True)
    results = new_weights_after_four_steps(engine, new)
    assert engine.time_split()["rebuild"] == 0
    for r in results:
        before = 5 if r.request_id < 4 else 0
        assert r.versions.tolist() == [0] * before + [1] * (12 - before)
        if before == 0:  # admitted after the update: read under the new weights only
            assert (r.logprobs.double() - forward_logprobs(new, r)).abs().max() < 1e-6
            continue
        assert (r.logprobs[:before].double() - forward_logprobs(old, r)[:before]).abs().max() < 1e-6
        kept = kept_kv_logprobs(old, new, r, before)
        assert (r.logprobs[before:].double() - kept).abs().max() < 1e-6
        # not what a re-read under the new weights gives: the old rows' KV was kept
        assert (r.logprobs[before:].double() - forward_logprobs(new, r)[before:]).abs().max() > 1e-3


def test_tiny_top_p_is_greedy(make_model, engine_class):
    model = make_model(0)
    engine = engine_class(model, eos_token_id=NEVER, pad_token_id=0, top_p=1e-9, max_batch=4)
    for r in engine.generate(requests([(3, 10), (6, 10)])):
        tokens = torch.cat([r.prompt_ids, r.output_ids])
        with torch.no_grad():
            argmax = model(tokens[None]).logits[0, len(r.prompt_ids) - 1 : -1].argmax(-1)
        assert r.output_ids.tolist() == argmax.tolist()


def test_temperature_zero_is_greedy_whatever_the_seed_with_logprobs_at_temperature_one(make_model, engine_class):
    model = make_model(0)
    runs = [engine_class(model, eos_token_id=NEVER, pad_token_id=0, temperature=0, max_batch=4, seed=s)
            .generate(requests([(3, 10), (6, 10)])) for s in (0, 1)]
    assert [r.output_ids.tolist() for r in runs[0]] == [r.output_ids.tolist() for r in runs[1]]
    for r in runs[0]:
        tokens = torch.cat([r.prompt_ids, r.output_ids])
        with torch.no_grad():
            argmax = model(tokens[None]).logits[0, len(r.prompt_ids) - 1 : -1].argmax(-1)
        assert r.output_ids.tolist() == argmax.tolist()
        torch.testing.assert_close(r.logprobs, forward_logprobs(model, r, 1.0), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="temperature must be > 0, or 0 for greedy decoding, got -1"):
        engine_class(model, eos_token_id=NEVER, pad_token_id=0, temperature=-1)


def test_eos_stop_sequences_and_stop_strings_end_at_their_first_occurrence(make_model, engine_class):
    model = make_model(0)
    req = requests([(4, 30)])
    full = engine_class(model, eos_token_id=NEVER, pad_token_id=0).generate(req)[0].output_ids.tolist()
    assert full[3] not in full[:3] and full[2:4] not in [full[i : i + 2] for i in range(2)]

    eos = engine_class(model, eos_token_id=full[3], pad_token_id=0).generate(req)[0]
    assert (eos.output_ids.tolist(), eos.finish_reason) == (full[:4], "eos")

    stop = engine_class(model, eos_token_id=NEVER, pad_token_id=0, stop_sequences=[full[2:4]])
    result = stop.generate(req)[0]
    assert (result.output_ids.tolist(), result.finish_reason) == (full[:4], "stop")

    text = engine_class(
        model,
        eos_token_id=NEVER,
        pad_token_id=0,
        stop_strings=[f"<{full[2]}><{full[3]}>"],
        decode=lambda ids: "".join(f"<{i}>" for i in ids),
    )
    result = text.generate(req)[0]
    assert (result.output_ids.tolist(), result.finish_reason) == (full[:4], "stop")

    length = engine_class(model, eos_token_id=NEVER, pad_token_id=0, max_new_tokens=30).generate(
        [GenRequest(0, req[0].prompt_ids)]
    )[0]
    assert (length.output_ids.tolist(), length.finish_reason) == (full, "length")


def test_bad_requests_are_refused_with_the_request_id(make_model, engine_class):
    engine = engine_class(make_model(0), eos_token_id=0, pad_token_id=0)
    with pytest.raises(ValueError, match="request 5: empty prompt"):
        engine.submit([GenRequest(5, [])])
    engine.submit([GenRequest(1, [3, 4])])
    with pytest.raises(ValueError, match="request 1: this request_id is already in flight"):
        engine.submit([GenRequest(1, [3, 4])])
    with pytest.raises(ValueError, match="stop_strings need a decode function"):
        engine_class(make_model(0), eos_token_id=0, pad_token_id=0, stop_strings=["\n"])


def three_steps_into_four_requests(model, engine_class):
    """Four requests on three rows (0, 1, 2 run; 3 waits), three steps in; and each one's output left alone."""
    reqs = requests([(3, 12), (5, 12), (1, 12), (8, 12)])
    untouched = {r.request_id: r for r in engine_class(model, eos_token_id=NEVER, pad_token_id=0,
                                                                max_batch=3).generate(reqs)}
    engine = engine_class(model, eos_token_id=NEVER, pad_token_id=0, max_batch=3)
    engine.submit(reqs)
    for _ in range(3):
        engine.step()
    return engine, untouched


def test_aborting_running_and_waiting_requests_leaves_the_others_as_they_would_have_been(make_model, engine_class):
    engine, untouched = three_steps_into_four_requests(make_model(0), engine_class)
    assert engine.progress() == {0: (4, 0), 1: (4, 0), 2: (4, 0)}  # a prefill's token and three decode steps
    assert engine.abort([1, 3]) == {1: 4, 3: 0}  # the middle row of the cache, and one still waiting
    results = []
    while engine.pending():
        results += engine.step()
    assert sorted(r.request_id for r in results) == [0, 2]
    for r in results:
        assert r.output_ids.tolist() == untouched[r.request_id].output_ids.tolist()
        torch.testing.assert_close(r.logprobs, untouched[r.request_id].logprobs, atol=1e-5, rtol=0)


def test_a_requeued_request_continues_where_it_was_and_finishes_as_it_would_have(make_model, engine_class):
    engine, untouched = three_steps_into_four_requests(make_model(0), engine_class)
    assert engine.requeue([1, 3]) == {1: 4}  # only a running request moves: 3 is waiting already
    assert engine.progress() == {0: (4, 0), 2: (4, 0)}  # 1 left its row
    results = engine.step()
    assert engine.progress()[1][0] == 6 and 3 not in engine.progress()  # 1 took its row back (prefill, decode)
    while engine.pending():
        results += engine.step()
    assert [r.request_id for r in results][-1] == 3  # 1 went to the front of the queue: 3 still waits behind it
    for r in results:  # its prefix re-prefilled, its own uniforms: the same tokens and logprobs
        assert r.output_ids.tolist() == untouched[r.request_id].output_ids.tolist()
        torch.testing.assert_close(r.logprobs, untouched[r.request_id].logprobs, atol=1e-5, rtol=0)


def recorded_reads(engine: GenerationEngine) -> list[tuple[int, int]]:
    """The [rows, tokens] of each forward the engine runs from now on (a list, so the caller sees it grow)."""
    read: list[tuple[int, int]] = []
    if isinstance(engine, TorchGenerationEngine):
        forward = engine.model.forward
        engine.model.forward = lambda *a, **kw: read.append(tuple(kw.get("input_ids", a and a[0]).shape)) or forward(
            *a, **kw)
    else:  # the slot engine's lean forward: a chunk a slot, or one token a slot
        lean = engine.forward
        extend, decode = lean.extend, lean.decode
        lean.extend = lambda kv, slots, ids, *rest: read.append(tuple(ids.shape)) or extend(kv, slots, ids, *rest)
        lean.decode = lambda kv, tokens, *rest: read.append((tokens.shape[0], 1)) or decode(kv, tokens, *rest)
    return read


def test_a_prompt_read_once_serves_its_other_requests_with_the_logprobs_of_a_float64_forward(make_model, engine_class):
    model = make_model(0).double()
    prompts = requests([(5, 9), (2, 9), (7, 9), (4, 9)], seed=3)
    # each prompt 4 times, round robin: the first forward reads 4 prompts of different lengths (left-padded)
    reqs = [GenRequest(4 * p.request_id + k, p.prompt_ids, max_new_tokens=3 + 2 * k + p.request_id)
            for k in range(4) for p in prompts]  # rows end at different steps: a running batch to copy into
    engine = engine_class(model, eos_token_id=NEVER, pad_token_id=0, max_batch=4)
    reads = recorded_reads(engine)
    engine.submit(reqs)
    results, steps = [], 0
    while engine.pending():
        results += engine.step()
        steps += 1
    assert engine.prompt_cache_hits == 12  # each prompt read by one forward, copied for its 3 other requests
    assert len(reads) == steps + 1  # a decode forward a step, and the first step's prefill that read all 4 prompts
    assert sorted(r.request_id for r in results) == list(range(16))
    for r in results:  # the copied rows continue exactly as a row that read its prompt does
        assert len(r.output_ids) == 3 + 2 * (r.request_id % 4) + r.request_id // 4
        torch.testing.assert_close(r.logprobs, forward_logprobs(model, r).float(), atol=1e-6, rtol=0)
        reference = forward_logprobs(model, r)  # float64 end to end: the engine's own float32 rounding only
        assert (r.logprobs.double() - reference).abs().max() < 1e-6


def test_a_weight_update_reads_each_prompt_once_then_every_output_over_its_copy_as_a_float64_forward_would(
        make_model, engine_class):
    old, new = make_model(0).double(), make_model(1).double()
    engine = engine_class(copy.deepcopy(old), eos_token_id=NEVER, pad_token_id=0, max_batch=8)
    group, other = requests([(6, 1), (3, 1)], seed=5)
    engine.submit([GenRequest(k, group.prompt_ids, max_new_tokens=8 + 3 * k) for k in range(4)]
                  + [GenRequest(4 + k, other.prompt_ids, max_new_tokens=9 + k) for k in range(2)])
    results = []
    for _ in range(3):  # each row: a token from its prompt's last logits, then one a decode step
        results += engine.step()
    engine.update_weights(new.state_dict(), version=1)
    read = recorded_reads(engine)
    results += engine.step()
    assert read == [(2, 6), (6, 3), (6, 1)]  # 2 prompts; 6 outputs of 4 tokens but the pending one; a decode step
    while engine.pending():
        results += engine.step()
    assert sorted(r.request_id for r in results) == list(range(6))
    for r in results:
        assert r.versions.tolist() == [0] * 4 + [1] * (len(r.output_ids) - 4)
        reference = torch.cat([forward_logprobs(old, r)[:4], forward_logprobs(new, r)[4:]])
        assert (r.logprobs.double() - reference).abs().max() < 1e-6


def test_re_reading_the_running_rows_after_a_weight_update_is_timed_apart_from_reading_newcomers(
        make_model, engine_class):
    engine = engine_class(make_model(0), eos_token_id=NEVER, pad_token_id=0, max_batch=4)
    engine.submit(requests([(3, 12), (5, 12), (1, 12), (8, 12), (4, 12)]))  # four rows run, one waits
    for _ in range(3):
        engine.step()
    before = engine.time_split()
    assert before["rebuild"] == 0 and before["prefill"] > 0 and before["decode"] > 0
    engine.update_weights(make_model(1).state_dict(), version=1)
    engine.step()  # no slot is free: the forward re-reads the four running rows and nothing else
    after = engine.time_split()
    assert after["rebuild"] > 0
    assert after["prefill"] - before["prefill"] < after["rebuild"] / 100  # two clock reads apart, no forward


def test_a_weight_update_empties_the_prompt_cache(make_model, engine_class):
    old, new = make_model(0), make_model(1)
    engine = engine_class(copy.deepcopy(old), eos_token_id=NEVER, pad_token_id=0, max_batch=4)
    prompt = requests([(6, 4)])[0].prompt_ids
    engine.submit([GenRequest(0, prompt, max_new_tokens=12), GenRequest(1, prompt, max_new_tokens=12)])
    engine.step()
    assert engine.prompt_cache_hits == 1  # one forward read the prompt; 1 copied 0's rows
    engine.update_weights(new.state_dict(), version=1)
    engine.submit([GenRequest(2, prompt, max_new_tokens=8)])  # admitted right after the rebuild of 0 and 1
    results = []
    while engine.pending():
        results += engine.step()
    assert engine.prompt_cache_hits == 2  # 2 copied the prompt the rebuild read under the new weights
    late = next(r for r in results if r.request_id == 2)
    assert late.versions.tolist() == [1] * 8
    torch.testing.assert_close(late.logprobs, forward_logprobs(new, late), atol=1e-5, rtol=0)
    assert (late.logprobs[:1] - forward_logprobs(old, late)[:1]).abs().max() > 1e-3


def test_a_copy_keeps_its_prompt_when_the_same_refills_fresh_reads_fill_the_kept_prompts(make_model, engine_class):
    model = make_model(0).double()
    a, b, c, d, e, f = ([k, k + 1, k + 2] for k in range(10, 70, 10))
    # four rows read A, B, C, D (kept in that order: A is the least recently used); B, C, D end together, then one
    # refill admits a copy of A and two fresh prompts, E and F, whose reads would push A out of the four kept
    reqs = [GenRequest(0, a, 9), GenRequest(1, b, 3), GenRequest(2, c, 3), GenRequest(3, d, 3),
            GenRequest(4, a, 6), GenRequest(5, e, 5), GenRequest(6, f, 5)]
    engine = engine_class(model, eos_token_id=NEVER, pad_token_id=0, max_batch=4, refill_min_free=3)
    results = {r.request_id: r for r in engine.generate(reqs)}
    assert engine.prompt_cache_hits == 1  # request 4 copied A's rows
    alone = engine_class(model, eos_token_id=NEVER, pad_token_id=0, max_batch=1).generate([reqs[4]])[0]
    assert results[4].output_ids.tolist() == alone.output_ids.tolist()
    assert (results[4].logprobs.double() - alone.logprobs.double()).abs().max() < 1e-6

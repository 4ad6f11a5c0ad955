"""bench_generation's baselines sample what the engine samples, so its ratios compare equal work."""

from __future__ import annotations

import pytest
import torch

from areal.engines import TorchGenerationEngine
from tests.benchmarks.loading import load_benchmark

bench = load_benchmark("bench_generation")


def _tokens_read(engine_class: type[TorchGenerationEngine]) -> type[TorchGenerationEngine]:
    """The engine class, counting the tokens its forwards read (`read`: a list, so the caller sees it grow)."""

    class Counted(engine_class):
        read = [0]

        def _forward(self, ids, mask, positions, cache):
            self.read[0] += ids.numel()
            return super()._forward(ids, mask, positions, cache)

    return Counted


def test_the_whole_row_re_read_baseline_samples_what_the_engine_samples_and_reads_more():
    model = bench.build_model().double()  # float64: the two orders of reading round alike, so tokens match
    prompts = bench.prompts(4, torch.Generator().manual_seed(0))
    lengths = [5, 9, 13, 20, 7, 11, 3, 16]
    runs = {name: bench.full_queue_run(_tokens_read(cls), model, prompts, lengths, group=2, refill=2, every=3, rows=4)
            for name, cls in (("baseline", bench.EveryRowReread), ("engine", TorchGenerationEngine))}
    (base, base_results), (engine, results) = runs["baseline"], runs["engine"]
    assert engine.version == base.version > 2  # weights landed mid-generation, as often in both
    assert [r.request_id for r in results] == [r.request_id for r in base_results]
    for r, b in zip(results, base_results, strict=True):
        assert torch.equal(r.output_ids, b.output_ids) and torch.equal(r.versions, b.versions)
        assert (r.logprobs - b.logprobs).abs().max() < 1e-6
    assert base.time_split()["rebuild"] > 0 and engine.time_split()["rebuild"] > 0
    assert type(engine).read[0] < type(base).read[0]  # a group's prompt read once, not once a row


@pytest.mark.slow  # ~45 s: the built-in tasks are built (their hidden tests run) before any request
def test_the_recipe_table_runs_both_engines_on_the_same_requests_and_they_draw_the_same_tokens():
    from areal.models.tiny import build_tiny_coder, tiny_coder_config
    from areal.models.tokenizer import CharTokenizer

    model = build_tiny_coder(0, tiny_coder_config(num_hidden_layers=1, intermediate_size=64)).double()
    table = bench.recipe_table(model, CharTokenizer(), repeat=1, rows_list=(4,))  # float64: no rounding ties
    assert table[4]["same_tokens"] and table[4]["tokens"] > 32  # 32 requests, each at least one token
    assert set(table[4]["tokens_per_cpu_s"]) == {"hf", "fixed"} and table[4]["limit"] > 0


def test_the_host_table_times_steps_and_refills_of_both_engines_over_stub_models():
    from areal.models.tiny import tiny_coder_config

    cells = bench.host_table((8,), (4, 40), tiny_coder_config(num_hidden_layers=1))
    assert set(cells) == {(8, 4), (8, 40)} and all(ms > 0 for row in cells.values() for ms in row)

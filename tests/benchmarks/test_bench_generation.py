"""bench_generation's baselines sample what the engine samples, so its ratios compare equal work."""

from __future__ import annotations

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

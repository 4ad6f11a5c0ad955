"""bench_branches: the declared branches run in two processes at once; the forced chain in one, in turn."""

from __future__ import annotations

import pytest

from tests.benchmarks.loading import load_benchmark

bench = load_benchmark("bench_branches")


@pytest.mark.slow  # two whole runs (27 s in CI): the default suite is kept under 15 minutes on 2 cores
def test_parallel_branches_overlap_in_two_processes_and_the_chain_runs_them_in_turn(tmp_path):
    parallel = bench.run_layout("parallel", work=20, steps=3, run_dir=tmp_path / "parallel")
    chain = bench.run_layout("chain", work=20, steps=3, run_dir=tmp_path / "chain")
    assert parallel["processes"] == 2 and chain["processes"] == 1
    assert parallel["overlap"] > 0.0  # some left call ran while a right call did
    assert chain["overlap"] == 0.0
    assert parallel["branch_s"] > 0.0 and chain["branch_s"] > 0.0
    rows = bench.table({"parallel": [parallel], "chain": [chain]})
    ratio = float(rows[2].split()[-1].rstrip("x"))
    assert abs(ratio - round(parallel["wall_s"] / chain["wall_s"], 2)) < 0.011  # the ratio of the measured walls
    assert rows[3].split()[-1] == "1.00x"


def test_overlap_counts_the_time_two_calls_ran_together():
    assert bench._overlap([(0.0, 2.0), (3.0, 4.0)], [(1.0, 3.5)]) == 1.0 + 0.5
    assert bench._overlap([(0.0, 1.0)], [(1.0, 2.0)]) == 0.0

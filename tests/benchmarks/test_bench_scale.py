"""bench_scale reads its memory column from /proc and its rates from a real emulated run's step records."""

from __future__ import annotations

import os

import pytest

from tests.benchmarks.loading import load_benchmark

bench = load_benchmark("bench_scale")


def test_the_machines_cpu_counters_grow():
    busy, total = bench._machine_cpu()
    assert 0 < busy < total


def test_smaps_reads_this_processes_resident_and_proportional_memory():
    fields = bench._smaps(os.getpid())
    assert fields["Rss"] >= fields["Pss"] > 0
    assert bench._smaps(2**22 + 7) == {}  # no such process: nothing, not an error


@pytest.mark.slow  # one short emulated run: ~15 s
def test_a_scaling_row_comes_from_the_runs_step_records(tmp_path):
    args = bench.argparse.Namespace(steps=4, time_scale=0.02, median=128, generators=[2], sigma=0.6)
    (row,) = bench.scaling(args, tmp_path)[1:]
    n, rate, ideal, share, cpu, msgs, rss, pss, busy = row.replace("%", "").split()
    assert int(n) == 2 and float(rate) > 0 and float(ideal) == pytest.approx(float(rate), rel=0.02)
    assert float(cpu) > 0 and float(msgs) > 0 and float(rss) >= float(pss) > 0 and 0 < float(busy) <= 100

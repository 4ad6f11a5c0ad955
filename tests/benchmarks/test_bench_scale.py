"""bench_scale reads its memory column from /proc and its rates from a real emulated run's step records."""

from __future__ import annotations

import os

import pytest

from tests.benchmarks.loading import load_benchmark

load_benchmark("scale_model")  # bench_scale imports these by name, as the script does
memory = load_benchmark("bench_worker_memory")
bench = load_benchmark("bench_scale")


def test_the_machines_cpu_counters_grow():
    busy, total = bench._machine_cpu()
    assert 0 < busy < total


def test_smaps_reads_this_processes_resident_and_proportional_memory():
    fields = memory.smaps_rollup(os.getpid())
    assert fields["Rss"] >= fields["Pss"] > 0
    assert memory.smaps_rollup(2**22 + 7) == {}  # no such process: nothing, not an error


def test_children_forked_after_the_imports_share_them_and_spawned_ones_do_not():
    spawned = memory.spawned(2, "import torch")
    children, zygote = memory.forked(3)
    # both map torch (over 100 MiB resident); a spawned interpreter built its own copy of the imported state
    # (private pages), a forked child writes almost none of its parent's (copy-on-write)
    assert all(s["Rss"] > 100 * 1024 and s["Private_Dirty"] > 50 * 1024 for s in spawned)
    assert all(c["Rss"] > 100 * 1024 and c["Private_Dirty"] < 10 * 1024 for c in children)
    assert all(c["Pss"] < c["Rss"] / 2 for c in children) and zygote["Pss"] > 0


@pytest.mark.slow  # one short emulated run: ~15 s
def test_a_scaling_row_comes_from_the_runs_step_records(tmp_path):
    args = bench.argparse.Namespace(set=[], steps=4, time_scale=0.02, scaling_time_scale=0.05, median=128,
                                    generators=[2], sigma=0.6)
    rates_header, rates, blank, costs_header, costs = bench.scaling(args, tmp_path)
    n, rate, n_x_one, share, modelled, of_model, busy = rates.replace("%", "").split()
    assert int(n) == 2 and float(rate) > 0 and float(n_x_one) == pytest.approx(float(rate), rel=0.02)
    # the runtime cannot beat a model of itself with no overhead; on this machine it should reach half of it
    assert 0.5 < float(rate) / float(modelled) < 1.05 and 0 < float(busy) <= 100
    assert "rollout CPU ms/sample" in costs_header and "score CPU ms/sample" in costs_header
    n, ctl_cpu, msgs, *pool_cpu, rss, pss = costs.split()
    assert float(ctl_cpu) > 0 and float(msgs) > 0 and all(float(c) > 0 for c in pool_cpu)
    assert float(rss) >= float(pss) > 0


def test_the_model_gets_the_runs_settings_and_prompts_from_the_recipe():
    config, prompts = bench.recipe_settings(["steps=3", "batch_size=4", "staleness=1"])
    assert (config.steps, config.batch_size, config.staleness) == (3, 4, 1)
    assert len(prompts) == 2 * (3 + 1 + 1) * 4 and all(10 < p < 1000 for p in prompts)  # twice: drops refill


@pytest.mark.slow  # two short emulated runs, the second with two trainer processes: ~15 s
def test_a_ranks_row_comes_from_a_run_with_that_many_trainer_processes(tmp_path):
    args = bench.argparse.Namespace(set=[], steps=4, time_scale=0.02, scaling_time_scale=0.05, median=128, sigma=0.6,
                                    rank_generators=2, trainer_ranks=[1, 2])
    title, blank, header, one, two = bench.ranks(args, tmp_path)
    assert "trainer ranks" in header
    k, per_rank, rate, of_one, modelled, of_model, ctl_cpu, msgs, trainer_cpu = two.replace("%", "").split()
    assert (int(k), int(per_rank)) == (2, 1) and float(rate) > 0 and 0.5 < float(rate) / float(modelled) < 1.05
    assert float(trainer_cpu) > 0 and float(ctl_cpu) > 0 and float(msgs) > 0
    assert sorted(log.name for log in (tmp_path / "ranks-2" / "logs").glob("actor-*.log")) == \
        ["actor-0.log", "actor-1.log"]  # the row's run had two trainer processes


def test_a_policy_model_row_is_a_share_of_one_strict_generator_with_its_price():
    args = bench.argparse.Namespace(set=[], policy_eta=2, sigma=0.6, model_steps=8, model_generators=[1, 2],
                                    policies=["strict", "drop"], steps=4, time_scale=0.1, scaling_time_scale=1.0,
                                    median=128)
    title, blank, header, *rows = bench.policy_model(args, None)
    assert "of N x one strict" in header and "tokens > η" in header and "trained/drawn" in header
    cells = [row.replace("%", "").split() for row in rows]
    assert [(c[0], c[1]) for c in cells] == [("1", "strict"), ("1", "drop"), ("2", "strict"), ("2", "drop")]
    assert cells[0][2] == "100"  # the unit: one strict generator
    n, policy, share, mean, p99, worst, stale, wasted, length = cells[2]
    assert int(worst) <= 2 and float(stale) == 0 and float(wasted) == 0 and 0.5 < float(length) < 1.5


def test_a_setting_given_with_set_reaches_the_model_and_the_title():
    """--set generation.max_batch=2: two slots for the 48 samples a generator holds, so the modelled rate falls."""
    common = dict(policy_eta=2, sigma=0.6, model_steps=8, model_generators=[1], policies=["strict"], steps=4,
                  time_scale=0.1, scaling_time_scale=1.0, median=128)
    free, tight = (bench.argparse.Namespace(set=given, **common) for given in ([], ["generation.max_batch=2"]))
    assert bench.policy_model(tight, None)[0] == bench.policy_model(free, None)[0] + ", generation.max_batch=2"
    free_rate, tight_rate = (bench.modelled(bench.weak_scaling(args, 1), generators=1)[0] for args in (free, tight))
    assert tight_rate < 0.5 * free_rate


def test_without_one_strict_generator_measured_the_share_is_a_dash_not_100_percent():
    args = bench.argparse.Namespace(set=[], policy_eta=2, sigma=0.6, model_steps=8, model_generators=[2],
                                    policies=["token", "strict"], steps=4, time_scale=0.1, scaling_time_scale=1.0,
                                    median=128)
    title, blank, header, *rows = bench.policy_model(args, None)
    assert [row.split()[:3] for row in rows] == [["2", "token", "—"], ["2", "strict", "—"]]


@pytest.mark.slow  # two short emulated runs: ~30 s
def test_a_policy_run_row_comes_from_the_runs_step_records(tmp_path):
    args = bench.argparse.Namespace(set=[], policy_eta=1, sigma=1.0, steps=5, time_scale=0.02, scaling_time_scale=0.2,
                                    median=128, generators=[1], policies=["strict", "token"])
    title, blank, header, strict, token = bench.policy_runs(args, tmp_path)
    n, policy, rate, share, modelled, of_model, mean, p99, worst, stale, wasted, length = token.replace(
        "%", "").split()
    assert policy == "token" and float(rate) > 0 and float(modelled) > 0 and float(stale) == 0
    assert int(worst) >= int(p99) >= 0 and float(length) > 0
    assert strict.replace("%", "").split()[3] == "100"

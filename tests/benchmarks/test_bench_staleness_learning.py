"""bench_staleness_learning: each run's lags, stale and wasted tokens and lengths read from its step records, and the
table's means over seeds."""

from __future__ import annotations

import json

from tests.benchmarks.loading import load_benchmark

first_run = load_benchmark("bench_first_run")
bench = load_benchmark("bench_staleness_learning")


def _run(tmp_path, variant: str, seed: int, steps: list[dict], rounds: list[float]):
    run = first_run.Run(variant, [], seed, tmp_path / f"{variant}-s{seed}")
    run.run_dir.mkdir()
    lines = [{"kind": "eval", "version": 0, "pass@1": rounds[0]}, *steps,
             *({"kind": "eval", "version": steps[-1]["version"], "pass@1": p} for p in rounds[1:])]
    (run.run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    run.rounds = [x for x in lines if x["kind"] == "eval"]
    return run


def _step(version, lags, tokens, masked=0, stale=0, dropped_tokens=0, trained=0, wall_s=10.0, busy=None, over_long=0,
          reward_mean=0.5, **more):
    return {"kind": "step", "version": version, "staleness": {str(k): v for k, v in lags.items()}, "tokens": tokens,
            "masked_tokens": masked, "stale_tokens": stale, "dropped_tokens": dropped_tokens,
            "trained_samples": trained, "wall_s": wall_s, "busy": busy or {"rollout[0]": 0.5, "actor[0]": 1.0},
            "over_long": over_long, "started": 10 * trained, "reward_mean": reward_mean, **more}


def test_a_runs_prices_come_from_every_step_record(tmp_path):
    steps = [_step(1, {0: 3, 1: 1}, tokens=100, masked=10, stale=0, dropped_tokens=20, trained=4, wall_s=2.0),
             _step(2, {1: 2, 4: 2}, tokens=60, masked=0, stale=30, dropped_tokens=50, trained=8, wall_s=4.0)]
    run = _run(tmp_path, "token-eta2", 0, steps, [0.2, 0.3])
    p = bench.prices(run.run_dir)
    assert p["version"] == 2 and p["samples_per_s"] == 8 / 4.0
    lags = [0, 0, 0, 1, 1, 1, 4, 4]
    assert p["lag_mean"] == sum(lags) / 8 and p["lag_max"] == 4 and p["lag_p99"] == 4
    assert p["stale"] == 30 / (160 - 10)  # of the tokens the loss read
    assert p["wasted"] == (10 + 50) / (160 + 50)  # masked, and dropped (the run's total so far)
    assert p["length"] == 160 / 8


def test_the_table_gives_each_policy_and_eta_its_mean_over_seeds_and_says_when_a_run_failed(tmp_path):
    runs = [_run(tmp_path, "strict-eta2", seed, [_step(5, {2: 4}, tokens=40, trained=4, wall_s=2.0)], [0.2, 0.2 + d])
            for seed, d in ((0, 0.1), (1, 0.3))]
    broken = first_run.Run("drop-eta4", [], 0, tmp_path / "drop-eta4-s0")
    broken.error = "exit 1: boom"
    unscored = _run(tmp_path, "token-eta2", 0, [_step(5, {2: 4}, tokens=40, trained=4)], [0.2])  # exit 0, no last round
    rows = bench.report([*runs, broken, unscored]).splitlines()
    strict = next(r for r in rows if r.startswith("| strict | 2 |"))
    cells = [c.strip() for c in strict.strip("|").split("|")]
    assert cells[2] == "2" and cells[3] == "0.200 ± 0.000" and cells[4] == "0.400 ± 0.100"
    assert cells[5] == "20.0 ± 10.0"  # gain in points, its standard error over the 2 seeds
    assert cells[7] == "2.00 ± 0.00" and cells[8] == "2.00 ± 0.00 / 2 / 2"  # samples/s; lag mean, p99, max
    assert next(r for r in rows if r.startswith("| drop | 4 |")).count("0 of 1 (failed: 'exit 1: boom')") == 1
    assert "0 of 1 (failed: 'no last held-out round" in next(r for r in rows if r.startswith("| token | 2 |"))


def test_tabulate_reads_the_kept_runs_and_marks_one_without_its_last_round(tmp_path):
    done = _run(tmp_path, "token-eta4", 1, [_step(3, {1: 4}, tokens=40, trained=4)], [0.25, 0.5])
    cut = tmp_path / "drop-eta2-s0"
    cut.mkdir()
    (cut / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "version": 0, "pass@1": 0.25}))
    _run(tmp_path, "strict-eta4", 0, [_step(3, {1: 4}, tokens=40, trained=4)], [0.25, 0.5])
    _run(tmp_path, "strict-eta4", 1, [_step(3, {1: 4}, tokens=40, trained=4)], [0.25, 0.5])
    kept = bench.kept_runs(tmp_path)
    assert [r.run_dir.name for r in kept] == ["drop-eta2-s0", "strict-eta4-s0", "strict-eta4-s1", "token-eta4-s1"]
    runs = {r.run_dir.name: r for r in kept}
    assert (runs["token-eta4-s1"].variant, runs["token-eta4-s1"].seed) == ("token-eta4", 1)
    assert runs["token-eta4-s1"].rounds == done.rounds and not bench.failure(runs["token-eta4-s1"])
    assert bench.failure(runs["drop-eta2-s0"]).startswith("no last held-out round")


def test_the_time_table_averages_busy_shares_re_reading_and_generation_over_steps_then_seeds(tmp_path):
    def steps(rebuild: list[float]) -> list[dict]:
        return [_step(v, {1: 4}, tokens=40, trained=4, busy={"rollout[0]": 0.2 * v, "actor[0]": 0.9},
                      generator_rebuild_share=r, generated_tokens_per_s=1000 * r)
                for v, r in enumerate(rebuild, start=1)]

    runs = [_run(tmp_path, "token-eta4", 0, steps([0.1, 0.3]), [0.2, 0.3]),  # busy 0.2, 0.4; re-reading 0.1, 0.3
            _run(tmp_path, "token-eta4", 1, steps([0.5, 0.5]), [0.2, 0.3]),
            _run(tmp_path, "strict-eta2", 0, [_step(1, {2: 4}, tokens=40, trained=4)], [0.2, 0.3])]  # vLLM: no split
    rows = bench.time_report(runs).splitlines()
    assert rows[0] == ("| policy | η | seeds | busy rollout[0] | busy actor[0] | generator time re-reading rows "
                       "| generated tokens/s | outputs cut |")
    token = [c.strip() for c in rows[2].strip("|").split("|")]
    assert token == ["token", "4", "2", "0.30 ± 0.00", "0.90 ± 0.00", "35.0 ± 15.0 %", "350 ± 150", "0.0 ± 0.0 %"]
    assert rows[3].endswith("| — | — | 0.0 % |")


def test_each_run_s_row_shows_its_gain_late_training_reward_most_outputs_cut_in_a_step_and_largest_weight(tmp_path):
    # over_long is the run's running count: 2, then 25 more (a drift from version 2), then 1 more
    # the training reward is the mean of the last LATE_STEPS steps': the first step's 0.9 falls out of it
    steps = bench.LATE_STEPS + 1
    drifting = [_step(1, {1: 4}, tokens=40, trained=4, over_long=2, importance_weight_max=1.5, reward_mean=0.9),
                _step(2, {1: 4}, tokens=40, trained=8, over_long=27, importance_weight_max=12.0, reward_mean=0.3),
                *(_step(v, {1: 4}, tokens=40, trained=4 * v, over_long=28, importance_weight_max=3.0, reward_mean=0.1)
                  for v in range(3, steps + 1))]
    calm = [_step(1, {1: 4}, tokens=40, trained=4, over_long=19, importance_weight_max=2.0, reward_mean=0.6)]
    rows = bench.run_report([_run(tmp_path, "strict-eta2", 1, drifting, [0.5, 0.2]),
                             _run(tmp_path, "drop-eta2", 0, calm, [0.5, 0.6])]).splitlines()
    assert rows[0].startswith("| policy | η | seed | gain (points) | training reward, last 20 steps |")
    assert "first ≥ 20 at" in rows[0]
    late = (0.3 + 0.1 * (bench.LATE_STEPS - 1)) / bench.LATE_STEPS  # 0.11
    cut = 100 * 28 / (10 * 4 * steps)  # 28 cut of the 840 the last step says were started
    assert rows[2] == f"| strict | 2 | 1 | -30.0 | {late:.2f} | {steps} | {cut:.1f} % | 25 (v2) | 12.0 |"
    assert rows[3] == "| drop | 2 | 0 | +10.0 | 0.60 | 1 | 47.5 % | 19 | 2.0 |"

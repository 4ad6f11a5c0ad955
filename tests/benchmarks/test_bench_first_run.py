"""bench_first_run: variants are parsed as given, each run's rounds read from its metrics, and the bar judged."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from tests.benchmarks.loading import BENCHMARKS, load_benchmark

bench = load_benchmark("bench_first_run")


def test_a_variant_is_a_name_and_its_settings_and_a_malformed_one_is_refused():
    assert bench.parse_variant("lr=trainer.lr=4e-4,steps=100") == ("lr", ["trainer.lr=4e-4", "steps=100"])
    assert bench.parse_variant("default=") == ("default", [])
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=key=value"):
        bench.parse_variant("nosettings")
    with pytest.raises(argparse.ArgumentTypeError, match="'steps' is not key=value"):
        bench.parse_variant("v=steps")


def _finished(tmp_path, name, rounds, wall_s):
    """A run as `finish` leaves it, read from a metrics file holding these (pass@1, SE) rounds."""
    run = bench.Run(name, [], 0, tmp_path / name)
    run.run_dir.mkdir()
    lines = [{"kind": "eval", "round": i, "version": 40 * i, "pass@1": p, "pass@1_se": se}
             for i, (p, se) in enumerate(rounds)] + [{"kind": "step", "version": 120, "wall_s": wall_s - 30,
                                                     "controller_cpu_s": 40.0}]
    (run.run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    workers = {"score[0]": {"pool": "score", "cpu_s": 300.0}, "score[1]": {"pool": "score", "cpu_s": 60.0},
               "actor[0]": {"pool": "actor", "cpu_s": 200.0}, "rollout[0]": {"pool": "rollout", "cpu_s": 100.0}}
    (run.run_dir / "status.json").write_text(json.dumps({"status": "stopped", "workers": workers}))
    run.process = subprocess.Popen([sys.executable, "-c", ""])
    run.process.wait()
    run.started = 0.0
    bench.finish(run)
    run.wall_s = wall_s  # the process above took no time: the wall is what the case says
    return run


def test_the_bar_needs_15_points_no_round_below_the_start_8_minutes_and_a_standard_error_under_1_point(tmp_path):
    good = _finished(tmp_path, "good", [(0.25, 0.008), (0.27, 0.009), (0.41, 0.009)], wall_s=470)
    assert bench.meets_bar(good) == {"gain": True, "no dip": True, "wall": True, "se": True}
    assert good.train_wall_s == 440
    dips = _finished(tmp_path, "dips", [(0.25, 0.008), (0.24, 0.009), (0.41, 0.009)], wall_s=470)
    assert bench.meets_bar(dips)["no dip"] is False
    short = _finished(tmp_path, "short", [(0.25, 0.008), (0.399, 0.009)], wall_s=481)
    assert bench.meets_bar(short) == {"gain": False, "no dip": True, "wall": False, "se": True}
    noisy = _finished(tmp_path, "noisy", [(0.25, 0.017), (0.45, 0.017)], wall_s=400)
    assert bench.meets_bar(noisy)["se"] is False
    points, error = bench.gain(noisy)
    assert points == pytest.approx(20.0) and error == pytest.approx(100 * (2 * 0.017**2) ** 0.5)
    table = bench.report([good, dips, short, noisy])
    assert "| good | 0 | v0 0.250±0.8, v40 0.270±0.9, v80 0.410±0.9 | +16.0 ± 1.2 | +2.0 | 470 s / 440 s |" in table
    assert "| dips | 0 | " in table and "| -1.0 | 470 s" in table
    assert "| good | 1/1 / 1/1 / 1/1 / 1/1 | +16.0 |" in table
    # each pool's replicas summed, largest first, shares of the run's 700 CPU seconds, over its 470 s
    assert ("| good | 0 | score 360 s (51 %) · actor 200 s (29 %) · rollout 100 s (14 %) · controller 40 s (6 %); "
            "1.49 cores |") in table


def test_a_failed_run_is_a_row_saying_why(tmp_path):
    run = bench.Run("broken", [], 3, tmp_path / "broken")
    run.run_dir.with_suffix(".log").write_text("RunError: the recipe is broken")
    run.process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(2)"])
    run.process.wait()
    bench.finish(run)
    assert "exit 2" in run.error and "the recipe is broken" in run.error
    assert bench.cpu_line(run) == "not reported"
    assert "| broken | 3 | failed: " in bench.report([run])


@pytest.mark.slow  # one real run of the default recipe at a tiny size (about a minute)
def test_a_run_pinned_to_its_own_core_runs_there_and_is_reported(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_first_run.py"), "--seeds", "0", "--parallel", "1",
         "--cores-per-run", "1", "--out", str(out), "--json", str(tmp_path / "runs.json"),
         "--variant", "tiny=steps=2,eval.interval_steps=0,eval.tasks=8,eval.samples=2"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = json.loads((tmp_path / "runs.json").read_text())
    assert [r["variant"] for r in runs] == ["tiny"] and not runs[0]["error"]
    assert [r["version"] for r in runs[0]["rounds"]] == [0, 2]
    first_core = sorted(os.sched_getaffinity(0))[0]
    assert f"started tiny seed 0 (cores [{first_core}])" in done.stderr

"""Sandboxed code reward: programs scored per second, and per-run cost vs a bare interpreter.

    python benchmarks/bench_sandbox.py [--runs 30] [--programs 60]

Timings on a shared 2-core machine are noisy; compare the printed ratios, not the absolutes.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

from areal.rewards import CodeTests, detect_layers

PROGRAM = "```python\ndef add(a, b):\n    return a + b\n```"
TESTS = {"kind": "call", "fn_name": "add", "inputs": [[1, 2], [3, 4], [5, 6]], "outputs": [3, 7, 11]}
ONE_TEST = {"kind": "call", "fn_name": "add", "inputs": [[1, 2]], "outputs": [3]}


def bare_ms(python: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([python, "-I", "-c", "pass"], check=True)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def sandbox_ms(scorer: CodeTests, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        (result,) = scorer([PROGRAM], [ONE_TEST])
        times.append(time.perf_counter() - start)
        assert result.reward == 1.0, result
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--programs", type=int, default=60)
    args = parser.parse_args()
    layers = detect_layers()
    print(layers.describe())
    bare = bare_ms(layers.python, args.runs)
    with CodeTests(timeout_s=2.0, workers=1) as one:
        single = sandbox_ms(one, args.runs)
    print(f"bare `python -I -c pass`        {bare:7.1f} ms (median of {args.runs})")
    print(f"one program, 1 test, sandboxed  {single:7.1f} ms   ratio {single / bare:.2f}x bare")
    for workers in (1, 2):
        with CodeTests(timeout_s=2.0, workers=workers) as scorer:
            start = time.perf_counter()
            results = scorer([PROGRAM] * args.programs, [TESTS] * args.programs)
            elapsed = time.perf_counter() - start
        assert all(r.reward == 1.0 for r in results)
        rate = args.programs / elapsed
        print(f"workers={workers}: {args.programs} programs x 3 tests in {elapsed:5.2f} s = {rate:5.1f} programs/s")


if __name__ == "__main__":
    main()

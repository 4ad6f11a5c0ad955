"""Sandboxed code reward: one bubblewrap per program vs the pool of warm workers, side by side.

    python benchmarks/bench_sandbox.py [--runs 30] [--programs 64]
    python benchmarks/bench_sandbox.py --humaneval 5

Prints the layers report, the latency of one program (1 test) against a bare `python -I -c
pass`, and programs scored per second (3 tests each) with 1 and 2 workers, for both paths (the
per-program path is the pool's jail in a worker used once); then what a pooled program's CPU is
made of: so much a job, so much a test. Pool figures exclude the workers'
start (once per run, printed apart). Wall times on a shared 2-core machine swing with
the others' load; the CPU columns (this process plus every sandbox process, reaped or live)
do not, and are the fair comparison.

`--humaneval N` instead times N rounds of HumanEval's 164 canonical solutions and 164 broken ones
(each canonical solution without its last line: most then return None, some no longer parse) in
one call with 2 workers, nothing remembered, and prints each round and the median: the figure
issue #57 compares before and after a change (run it on each tree, interleaved).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import time

from areal.rewards import CodeTests, detect_layers
from areal.runtime.worker.cpu_usage import tree_cpu_s as cpu_s

PROGRAM = "```python\ndef add(a, b):\n    return a + b  # run {}\n```"  # distinct, so none is reused
TESTS = {"kind": "call", "fn_name": "add", "inputs": [[1, 2], [3, 4], [5, 6]], "outputs": [3, 7, 11]}
ONE_TEST = {"kind": "call", "fn_name": "add", "inputs": [[1, 2]], "outputs": [3]}
PATHS = {"per-program bwrap": False, "pool": True}


def bare_ms(python: str, runs: int) -> tuple[float, float]:
    """(median wall, mean CPU) of `python -I -c pass`, in ms."""
    times, cpu = [], cpu_s()
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([python, "-I", "-c", "pass"], check=True)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times), 1000 * (cpu_s() - cpu) / runs


RUN_IDS = itertools.count()


def timed(scorer: CodeTests, programs: int, tests: dict) -> float:
    batch = [PROGRAM.format(next(RUN_IDS)) for _ in range(programs)]
    start = time.perf_counter()
    results = scorer(batch, [tests] * programs)
    elapsed = time.perf_counter() - start
    assert all(r.reward == 1.0 for r in results), results
    return elapsed


def one_program_ms(pooled: bool, runs: int) -> tuple[float, float, float]:
    """(first call, median wall, mean CPU) for one program with one test, in ms."""
    with CodeTests(timeout_s=2.0, workers=1, pooled=pooled) as scorer:
        first = timed(scorer, 1, ONE_TEST)
        cpu = cpu_s()
        times = [timed(scorer, 1, ONE_TEST) for _ in range(runs)]
        cpu = cpu_s() - cpu
    return 1000 * first, 1000 * statistics.median(times), 1000 * cpu / runs


def programs_per_s(pooled: bool, workers: int, programs: int) -> tuple[float, float]:
    """(programs per wall second, CPU ms per program) for `programs` programs of 3 tests."""
    with CodeTests(timeout_s=2.0, workers=workers, pooled=pooled) as scorer:
        timed(scorer, workers, TESTS)  # start every worker (a no-op for the per-program path)
        cpu = cpu_s()
        rate = programs / timed(scorer, programs, TESTS)
        return rate, 1000 * (cpu_s() - cpu) / programs


def job_and_test_ms(programs: int, rounds: int = 2) -> tuple[float, float]:
    """(CPU ms a job, CPU ms a test) of one pooled worker: programs of 1 test against programs of 16, interleaved,
    `rounds` times; a test is the difference over the 15 more, a job what the 1-test program costs beyond it."""

    def tests(n: int) -> dict:
        inputs = [[i, 1] for i in range(n)]
        return {"kind": "call", "fn_name": "add", "inputs": inputs, "outputs": [a + b for a, b in inputs]}

    spent = {1: 0.0, 16: 0.0}
    with CodeTests(timeout_s=2.0, workers=1) as scorer:
        timed(scorer, 1, tests(1))  # start the worker
        for _ in range(rounds):
            for n in spent:
                cpu = cpu_s()
                timed(scorer, programs, tests(n))
                spent[n] += cpu_s() - cpu
    one, sixteen = (1000 * spent[n] / (rounds * programs) for n in (1, 16))
    test = (sixteen - one) / 15
    return one - test, test


def broken(solution: str) -> str:
    """A canonical solution without its last non-blank line."""
    lines = solution.rstrip().splitlines()
    return "\n".join(lines[:-1]) + "\n"


def humaneval_rounds(rounds: int) -> None:
    """Rounds of the 164 canonical and 164 broken HumanEval programs: wall s and CPU ms per program."""
    from areal.data.humaneval import humaneval_problems
    from areal.rewards import HumanEvalTests

    problems = humaneval_problems()
    tests = [{"kind": "humaneval", "prompt": p["prompt"], "test": p["test"], "entry_point": p["entry_point"]}
             for p in problems]
    programs = [p["canonical_solution"] for p in problems] + [broken(p["canonical_solution"]) for p in problems]
    walls, cpus = [], []
    for i in range(rounds):
        with HumanEvalTests(workers=2, remember=0) as judge:
            judge(programs[:2], tests[:2])  # start both workers
            cpu, start = cpu_s(), time.perf_counter()
            results = judge(programs, tests * 2)
            walls.append(time.perf_counter() - start)
            cpus.append(1000 * (cpu_s() - cpu) / len(programs))
        passed = sum(r.reward for r in results[: len(problems)]), sum(r.reward for r in results[len(problems) :])
        print(f"round {i}: {walls[-1]:.2f} s wall, {cpus[-1]:.1f} ms CPU per program; "
              f"canonical passed {passed[0]:g}/{len(problems)}, broken passed {passed[1]:g}/{len(problems)}")
    print(f"median: {statistics.median(walls):.2f} s wall, {statistics.median(cpus):.1f} ms CPU per program "
          f"({len(programs)} programs)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--programs", type=int, default=64)
    parser.add_argument("--humaneval", type=int, default=0, help="rounds of HumanEval's 164 + 164 programs instead")
    args = parser.parse_args()
    if args.humaneval:
        humaneval_rounds(args.humaneval)
        return
    layers = detect_layers()
    print(layers.describe())
    bare, bare_cpu = bare_ms(layers.python, args.runs)
    print(f"bare `python -I -c pass`: {bare:.1f} ms wall (median of {args.runs}), {bare_cpu:.1f} ms CPU\n")
    print("                   one program, 1 test (median)       3 tests each, x programs/s  CPU ms/program")
    columns = ("wall ms", 8), ("vs bare", 8), ("CPU ms", 7), ("vs bare", 8), ("  w=1", 9), ("w=2", 7), ("  w=1", 8)
    print(f"{'path':<18}" + "".join(f" {name:>{width}}" for name, width in columns) + f" {'w=2':>6}")
    rows = {}
    for name, pooled in PATHS.items():
        first, wall, cpu = one_program_ms(pooled, args.runs)
        (rate1, cpu1), (rate2, cpu2) = (programs_per_s(pooled, workers, args.programs) for workers in (1, 2))
        rows[name] = (wall, cpu, rate1, rate2)
        print(
            f"{name:<18} {wall:8.1f} {wall / bare:7.2f}x {cpu:7.1f} {cpu / bare_cpu:7.2f}x   "
            f"{rate1:7.1f} {rate2:7.1f}   {cpu1:6.1f} {cpu2:6.1f}"
        )
        if pooled:
            print(f"{'':<18} (first call, starting the worker: {first:.0f} ms wall)")
    old, new = rows.values()
    print(
        f"\npool vs per-program: {old[0] / new[0]:.1f}x lower latency, {old[1] / new[1]:.1f}x less CPU per "
        f"program, {new[2] / old[2]:.1f}x / {new[3] / old[3]:.1f}x programs/s with 1 / 2 workers "
        f"({args.programs} programs x 3 tests)"
    )
    job, test = job_and_test_ms(args.programs)
    print(f"pool, one worker, CPU of a program split: {job:.1f} ms a job + {test:.2f} ms a test "
          f"({args.programs} programs of 1 test against {args.programs} of 16, twice, interleaved)")


if __name__ == "__main__":
    main()

"""The runner's own work is the job's (issue #57): compiling the program, and reading what it writes.

The runner is trusted code, but what it does for a program is the program's doing: the compile of
a huge source, the reading of a stderr written a byte at a time. Each must run under the test's
limits or be counted in the test's CPU, on every path (`conftest.PATHS`).
"""

from __future__ import annotations

import pytest

from tests.rewards.conftest import PATHS, path_scorer, run_one

DONE = {"kind": "stdio", "inputs": [""], "outputs": ["done"]}
# ~1.4 s of CPU to compile on this machine, nothing to run: the cost grows with the square of the count
MANY_DEFS = "\n".join("def f():\n    pass" for _ in range(6000)) + "\nprint('done')\n"
# the compiler folds each 'a' * 4096 to a constant and every partial sum of them, and keeps each
# until the compile ends: 4096 x 600^2 / 2 bytes = 737 MB from 6 KB of source. Under a memory
# limit it stops folding where memory runs out (a failed fold is left unfolded) and the program
# runs: it prints whether its runner's peak and its own stayed within the job's 256 MB
FOLDED_SUM = "x = " + " + ".join(["'a' * 4096"] * 600) + """
import os

def peak_mb(pid):
    return next(int(line.split()[1]) >> 10 for line in open(f"/proc/{pid}/status") if line.startswith("VmHWM"))

print(peak_mb(os.getppid()) < 256, peak_mb(os.getpid()) <= 256)
"""
WITHIN = {"kind": "stdio", "inputs": [""], "outputs": ["True True"]}
# one byte of stderr at a time, each waited on until the runner has read it: the runner spends
# at least as much CPU reading as the program spends writing, and before #57 nobody counted it
DRIP = """
import fcntl, os, struct, termios, time
while time.process_time() < 0.8:
    os.write(2, b"x")
    while struct.unpack("i", fcntl.ioctl(2, termios.FIONREAD, b"1234"))[0]:
        os.sched_yield()
print("done")
"""


@pytest.mark.parametrize("path", PATHS)
def test_compiling_the_program_counts_against_its_tests_cpu(path):
    with path_scorer(path, timeout_s=0.25) as scorer:
        result = run_one(scorer, MANY_DEFS, DONE)
    # one busy process: its CPU and its wall time reach the limit together, and either clock may end it
    assert (result.reward, result.reason) == (0.0, "timeout"), result


@pytest.mark.parametrize("path", PATHS)
def test_compiling_the_program_is_bounded_by_its_memory_limit(path):
    with path_scorer(path) as scorer:  # memory_mb=256
        result = run_one(scorer, FOLDED_SUM, WITHIN)
    # what folding left of its memory limit may be too little for the rest of the program
    assert result.reward == 1.0 or (result.reason, result.detail) == ("memory", "MemoryError"), result


@pytest.mark.parametrize("path", PATHS)
def test_the_runner_reading_a_dripped_stderr_counts_against_the_test(path):
    with path_scorer(path) as scorer:  # timeout_s=1.0: 0.8 s of the program's own, and the runner's
        result = run_one(scorer, DRIP, DONE)
    assert (result.reward, result.reason) == (0.0, "timeout"), result
    assert "s of CPU" in result.detail, result.detail

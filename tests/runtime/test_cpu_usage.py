"""A worker's CPU: its own, its live descendants' at any depth, and its reaped children's, none counted twice."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import time

import pytest

from areal.runtime.worker.cpu_usage import tree_cpu_s

BURN_S = 0.4
# burns BURN_S of CPU, says so, then waits for its stdin to close
BURNER = ("import sys, time\nwhile time.process_time() < {burn}: pass\nprint('burned', flush=True)\n"
          "sys.stdin.read()\n")
# starts a burner of its own (its stdout the same pipe) and waits with it: the burner is a grandchild
PARENT = ("import subprocess, sys\nchild = subprocess.Popen([sys.executable, '-c', {burner!r}], stdin=sys.stdin)\n"
          "sys.exit(child.wait())\n")


def _started(code: str) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline() == "burned\n"  # blocks until it has burned
    return process


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="live descendants are found through Linux's /proc")
@pytest.mark.parametrize("depth", ["child", "grandchild"])
def test_a_live_descendants_cpu_counts_and_still_counts_once_it_is_reaped(depth):
    burner = BURNER.format(burn=BURN_S)
    before, own_before = tree_cpu_s(), time.process_time()
    process = _started(burner if depth == "child" else PARENT.format(burner=burner))
    try:
        live = tree_cpu_s() - before - (time.process_time() - own_before)
        # its burn (less a few of /proc's 10 ms ticks), plus an interpreter's start or two, counted once
        assert BURN_S - 0.05 <= live < BURN_S + 1.0
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(timeout=30)
    reaped = tree_cpu_s() - before - (time.process_time() - own_before)
    assert live - 0.05 <= reaped < BURN_S + 1.0  # moved into RUSAGE_CHILDREN: neither lost nor doubled


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="live descendants are found through Linux's /proc")
def test_a_thread_that_ends_during_the_scan_hides_no_other_threads_children(monkeypatch):
    """A run's summary once gave its scorer 14 s of CPU where its step records had 189 s: the worker's heartbeat
    thread ended while the last figure was taken, and the failed read of that thread's children dropped every
    child (the sandbox's workers). Here the listing holds a thread that is gone by the time it is read."""
    process = _started(BURNER.format(burn=BURN_S))
    try:
        counted = tree_cpu_s()
        listed = pathlib.Path.iterdir

        def with_a_thread_gone(self: pathlib.Path):  # noqa: ANN202
            entries = list(listed(self))
            return [*entries, self / "2147483647"] if self.name == "task" else entries

        monkeypatch.setattr(pathlib.Path, "iterdir", with_a_thread_gone)
        assert tree_cpu_s() >= counted  # the burner's CPU is still there, not hidden by the vanished thread
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(timeout=30)

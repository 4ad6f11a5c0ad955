"""CPU seconds of this process and of every process it started, so a run can say where its cores went.

A worker's busy fraction says how long its node ran, not what it cost: the code reward's sandbox runs every
program in processes of its own, whose CPU no `time.process_time()` of the worker sees. Counted here: this
process (all its threads), the descendants it has reaped (RUSAGE_CHILDREN), and each live descendant with the
ones it reaped itself (/proc: utime, stime, cutime, cstime), found through /proc/PID/task/TID/children. A live
descendant's live children are counted on their own, so nothing is counted twice. Off Linux only this process
and its reaped children count.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def tree_cpu_s() -> float:
    """CPU seconds so far of this process, its reaped descendants and its live ones (user + system)."""
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + reaped.ru_utime + reaped.ru_stime + _live_descendants_cpu_s(os.getpid())


def _live_descendants_cpu_s(root: int) -> float:
    ticks, todo = 0, _children(root)
    while todo:
        pid = todo.pop()
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile: its parent's reaped total has it, or soon will
        ticks += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
        todo += _children(pid)
    return ticks * _TICK_S


def _children(pid: int) -> list[int]:
    """Children of every thread of `pid`; a thread that ends between the listing and its read hides only its own
    (a worker's threads come and go: its heartbeat's stops just before the last figure is taken)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []
    children = []
    for task in tasks:
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return children

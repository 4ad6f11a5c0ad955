"""What one test's processes take right now, read from /proc: CPU, memory, and time spent queued.

The runner asks this every few tens of milliseconds while a test runs, so that a limit holds
for the test as a whole, not per process: CPU seconds summed over every process (a hundred
busy children spend the budget a hundred times faster), memory summed over every process plus
the files on the job's tmpfs, and the time the test's first process waited for a CPU, which the
wall clock should not charge to it (a neighbour's load must not turn a correct program into a
timeout). It only measures; the harness decides and kills.

"The test's processes" are every process of the job's PID namespace but the runner when the
runner is its PID 1, else (the plain path, no namespace) the other processes in the runner's
session, which the seccomp filter keeps them in. Stdlib only: it runs inside the jail, from source.
"""

from __future__ import annotations

import os

CLK_TCK = os.sysconf("SC_CLK_TCK")
KIB = 1024


class JobMeter:
    """Samples of one test, whose first process is `pid`; `scratch` are the job's tmpfs mounts."""

    def __init__(self, pid: int, whole_namespace: bool, scratch: tuple[str, ...]) -> None:
        self.pid, self.whole_namespace, self.scratch = pid, whole_namespace, scratch
        self.runner, self.session = os.getpid(), b"%d" % os.getsid(0)

    def processes(self) -> list[int]:
        """Pids of the test's processes that are alive or not yet reaped."""
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
        if self.whole_namespace:
            return [pid for pid in pids if pid != self.runner]
        return [pid for pid in pids if pid != self.runner and (_stat(pid) or [b""] * 6)[5] == self.session]

    def cpu_s(self, pids: list[int]) -> float:
        """CPU seconds of `pids`, with the children each has reaped (stat fields 14-17)."""
        ticks = 0
        for pid in pids:
            fields = _stat(pid)
            if fields is not None:
                ticks += sum(int(f) for f in fields[13:17])
        return ticks / CLK_TCK

    def memory_bytes(self, pids: list[int]) -> int:
        """Resident anonymous and shared memory of `pids`, plus the job's tmpfs files.

        A page two processes share after fork counts in both (proportional sizes need ptrace
        access to each process, which the runner gives up): the sum errs on the side of the host.
        """
        return sum(_fields(pid, "status", (b"RssAnon:", b"RssShmem:")) for pid in pids) + self.scratch_bytes()

    def scratch_bytes(self) -> int:
        used = 0
        for path in self.scratch:
            st = os.statvfs(path)
            used += (st.f_blocks - st.f_bfree) * st.f_frsize
        return used

    def queued_s(self) -> float:
        """Seconds the test's first process has waited on a run queue (0 where not reported)."""
        fields = (_read(f"/proc/{self.pid}/schedstat") or b"").split()
        return int(fields[1]) / 1e9 if len(fields) > 1 else 0.0


def _read(path: str) -> bytes | None:
    """A small /proc file's bytes, None once its process is gone (raw os calls: this runs per tick)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 1 << 16)
    except OSError:
        return None
    finally:
        os.close(fd)


def _stat(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat, field N at index N - 1 (the command name left blank), None once gone."""
    data = _read(f"/proc/{pid}/stat")
    return None if data is None else [b"", b"", *data.rsplit(b")", 1)[1].split()]


def _fields(pid: int, name: str, keys: tuple[bytes, ...]) -> int:
    """Bytes in the kB lines `keys` of /proc/PID/`name`; 0 once the process is gone."""
    data = _read(f"/proc/{pid}/{name}")
    if data is None:
        return 0
    return sum(int(line.split()[1]) * KIB for line in data.splitlines() if line.startswith(keys))

"""What one test's processes take right now, read from /proc: CPU, memory, and time spent queued.

The runner asks this every few tens of milliseconds while a test runs, so that a limit holds
for the test as a whole, not per process: CPU seconds summed over every process (a hundred
busy children spend the budget a hundred times faster) and the runner's own while it watches
(what it reads, the program wrote: issue #57), memory summed over every process plus the files
on the job's tmpfs, the data queued on its unix sockets and the negative dentries its lookups
left (kernel memory no process maps), and the time the test's first process waited for a CPU,
which the wall clock should not charge to it (a neighbour's load must not turn a correct
program into a timeout). It only measures; the harness decides and kills.

"The test's processes" are every process of the job's PID namespace but the runner when the
runner is its PID 1, else (the plain path, no namespace) the processes in the test's session,
which its first process opened and the seccomp filter keeps them in, and the runner's children. Every process a
test ever started is counted, reaped or not: it is alive or a zombie (orphans go to the runner,
PID 1 or a subreaper, which reaps only when the test ends), or a process of the test reaped it
and holds its time in its own children's counters. The one way around that, a parent whose
SIGCHLD is ignored so that the kernel reaps its children and adds their time to no one, is
denied by the seccomp filter; where a worker has a cgroup, its CPU counter (`CgroupCpu`) counts
the job whatever happened to its processes, and the larger of the two is the test's CPU.
Stdlib only: it runs inside the jail, from source.
"""

from __future__ import annotations

import os
import socket
import struct
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")
KIB = 1024
DENTRY_STATE = "/proc/sys/fs/dentry-state"  # its fifth field counts the machine's negative dentries
# what one negative dentry may hold: the dentry (192 bytes on x86_64) and a name of up to 255 bytes
# kept apart (kmalloc-512); more than most take, so the count errs on the side of the host
NEGATIVE_DENTRY_BYTES = 1024
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLMSG_ERROR, NLMSG_DONE = 4, 20, 2, 3
NLM_F_REQUEST_DUMP = 0x301
UDIAG_SHOW_MEMINFO, UNIX_DIAG_MEMINFO = 0x20, 5
NLMSG = struct.Struct("=IHHII")  # length, type, flags, seq, pid
UNIX_DIAG_REQ = struct.Struct("=BBHIIIII")  # family, protocol, pad, states, ino, show, cookie[2]
UNIX_DIAG_MSG_BYTES = 16
RTATTR = struct.Struct("=HH")  # length, type
MEMINFO = struct.Struct("=9I")  # SK_MEMINFO_*: rmem_alloc, rcvbuf, wmem_alloc, ...


class UnixSockets:
    """The unix sockets of this network namespace, through sock_diag: bytes their queues hold.

    Data written to a unix socket and not yet read is kernel memory charged to no process; a
    program could park hundreds of MB there. The netlink socket is opened before the seccomp
    filter (which allows unix sockets only), once per job.
    """

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)

    def fileno(self) -> int:
        return self.sock.fileno()

    def queued_bytes(self) -> int:
        """Memory allocated for queued data, both directions, over every unix socket of the namespace."""
        request = UNIX_DIAG_REQ.pack(socket.AF_UNIX, 0, 0, 0xFFFFFFFF, 0, UDIAG_SHOW_MEMINFO, 0xFFFFFFFF, 0xFFFFFFFF)
        self.sock.send(NLMSG.pack(NLMSG.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST_DUMP, 1, 0) + request)
        total = 0
        while True:
            data = self.sock.recv(1 << 16)
            at = 0
            while at + NLMSG.size <= len(data):
                length, kind = NLMSG.unpack_from(data, at)[:2]
                if kind in (NLMSG_DONE, NLMSG_ERROR) or length < NLMSG.size:
                    return total
                total += _meminfo(data, at + NLMSG.size + UNIX_DIAG_MSG_BYTES, at + length)
                at += (length + 3) & ~3
            if not data:
                return total


def _meminfo(data: bytes, at: int, end: int) -> int:
    """rmem_alloc + wmem_alloc from the UNIX_DIAG_MEMINFO attribute among those in data[at:end]."""
    while at + RTATTR.size <= end:
        length, kind = RTATTR.unpack_from(data, at)
        if length < RTATTR.size:
            return 0
        if kind == UNIX_DIAG_MEMINFO and length >= RTATTR.size + MEMINFO.size:
            values = MEMINFO.unpack_from(data, at + RTATTR.size)
            return values[0] + values[2]
        at += (length + 3) & ~3
    return 0


class CgroupCpu:
    """The CPU time of the worker's cgroup since this test began, the runner's own included.

    The cgroup holds the job's processes, its runner, and the worker's server, which
    waits while a test runs; the kernel charges it every process's time, whether that process is
    alive, a zombie, or was reaped by anyone. The runner's is the test's too: what it does while a
    test runs (forking it, reading what it writes, measuring it) grows with what the program does.
    `path` is its cpu.stat (v2, usage_usec) or cpuacct.usage (v1, nanoseconds), bound read-only
    into the jail. Made before the test forks.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.start_ns = self._usage_ns()

    def spent_s(self) -> float:
        return (self._usage_ns() - self.start_ns) / 1e9

    def _usage_ns(self) -> int:
        data = _read(self.path) or b"0"
        if data[:1].isdigit():
            return int(data.split()[0])
        fields = dict(line.split()[:2] for line in data.splitlines() if line.strip())
        return int(fields.get(b"usage_usec", 0)) * 1000


class JobMeter:
    """Samples of one test, whose first process is `pid`; `scratch` are the job's tmpfs mounts, and
    `sockets` its network namespace's unix sockets (None on the plain path: they would be the host's)."""

    def __init__(
        self,
        pid: int,
        whole_namespace: bool,
        scratch: tuple[str, ...],
        sockets: UnixSockets | None,
        cgroup: CgroupCpu | None = None,
    ) -> None:
        self.pid, self.whole_namespace, self.scratch, self.sockets = pid, whole_namespace, scratch, sockets
        self.cgroup = cgroup
        self.runner, self.session = os.getpid(), b"%d" % pid  # the first process opens the test's session
        self.runner_cpu_s = time.process_time()
        self.negatives = _negative_dentries()
        runner = _stat(self.runner) or []
        self.priority = (runner[18], runner[40])  # (nice, policy): what the test's first process starts at
        self.runner_field = b"%d" % self.runner
        self.queued, self.demoted = 0.0, False

    def processes(self) -> list[int]:
        """Pids of the test's processes that are alive or not yet reaped."""
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
        if self.whole_namespace:
            return [pid for pid in pids if pid != self.runner]
        return [pid for pid in pids if pid != self.runner and self._ours(_stat(pid) or [b""] * 6)]

    def _ours(self, fields: list[bytes]) -> bool:
        """On the plain path: in the test's session, or the runner's child (an orphan it adopted as
        subreaper, or the first process before it opened its session)."""
        return fields[5] == self.session or fields[3] == self.runner_field

    def cpu_s(self, pids: list[int]) -> float:
        """CPU seconds of `pids`, with the children each has reaped (stat fields 14-17), and the
        runner's since the test began; where the worker has a cgroup, its count if larger (see the
        module docstring)."""
        ticks = 0
        for pid in pids:
            fields = _stat(pid)
            if fields is not None:
                ticks += sum(int(f) for f in fields[13:17])
        counted = ticks / CLK_TCK + time.process_time() - self.runner_cpu_s
        return counted if self.cgroup is None else max(counted, self.cgroup.spent_s())

    def dentry_bytes(self) -> int:
        """The negative dentries the machine gained since the test began, at NEGATIVE_DENTRY_BYTES each.

        A failed lookup under a directory of the host's file systems (the read-only /usr) leaves one
        in the host's cache, where it outlives the job; no per-process count sees them, and outside
        a cgroup nothing charges them to the job. The count is the machine's: another process's
        lookups while the test runs count too, which only a flood of them makes matter.
        """
        return max(_negative_dentries() - self.negatives, 0) * NEGATIVE_DENTRY_BYTES

    def memory_bytes(self, pids: list[int]) -> int:
        """Resident anonymous and shared memory of `pids`, plus the job's tmpfs files and socket queues.

        A page two processes share after fork counts in both (proportional sizes need ptrace
        access to each process, which the runner gives up): the sum errs on the side of the host.
        """
        resident = sum(_process_memory(pid) for pid in pids)
        return resident + self.scratch_bytes() + (self.sockets.queued_bytes() if self.sockets else 0)

    def scratch_bytes(self) -> int:
        used = 0
        for path in self.scratch:
            st = os.statvfs(path)
            used += (st.f_blocks - st.f_bfree) * st.f_frsize
        return used

    def queued_s(self) -> float:
        """Seconds the test's first process waited on a run queue while it ran at the runner's priority.

        Only a neighbour's load is forgiven: a process that lowered its own priority (nice, a
        scheduling policy, its session's autogroup) queues by its own doing, so its count stops at
        the first sample that sees it changed, and stays there (an unprivileged process cannot
        raise its nice back; the jail's /proc is read-only, so only the plain path's program can
        write its autogroup at all).
        """
        if not self.demoted:
            fields = _stat(self.pid)
            if fields is None or (fields[18], fields[40]) != self.priority or _autogroup_nice(self.pid) > 0:
                self.demoted = True
            else:
                sched = (_read(f"/proc/{self.pid}/schedstat") or b"").split()
                self.queued = int(sched[1]) / 1e9 if len(sched) > 1 else 0.0
        return self.queued


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


def _negative_dentries() -> int:
    fields = (_read(DENTRY_STATE) or b"").split()
    return int(fields[4]) if len(fields) > 4 else 0


def _autogroup_nice(pid: int) -> int:
    """The nice of the autogroup of `pid`'s session ("/autogroup-N nice X"), 0 where there is none.

    A new session's autogroup starts at 0, so anything above is the test's own doing."""
    fields = (_read(f"/proc/{pid}/autogroup") or b"").split()
    return int(fields[-1]) if len(fields) == 3 else 0


def _stat(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat, field N at index N - 1 (the command name left blank), None once gone."""
    data = _read(f"/proc/{pid}/stat")
    return None if data is None else [b"", b"", *data.rsplit(b")", 1)[1].split()]


MEMORY_KEYS = (b"RssAnon:", b"RssShmem:", b"VmSwap:")


def _process_memory(pid: int) -> int:
    """Anonymous, shared and swapped-out bytes of one process.

    A leader thread that exited while other threads run shows no memory in its own status (the
    threads still hold it): then the first live thread's status answers for the process.
    """
    held = _memory(f"/proc/{pid}/status")
    if held is None:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return 0
        held = next((b for tid in tids if (b := _memory(f"/proc/{pid}/task/{tid}/status")) is not None), None)
    return held or 0


def _memory(status: str) -> int | None:
    """Bytes in the memory lines of a status file, None where it has none (no mm, or gone)."""
    lines = [line for line in (_read(status) or b"").splitlines() if line.startswith(MEMORY_KEYS)]
    return sum(int(line.split()[1]) * KIB for line in lines) if lines else None

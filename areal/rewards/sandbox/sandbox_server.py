"""The long-lived server inside one pooled bubblewrap sandbox: a fresh jail for every job.

The one idea: the worker is reused, its processes and files never are. Per job the server starts
the job's runner with clone3 straight into fresh user, PID, mount, IPC, network and UTS namespaces,
as PID 1 of the new PID namespace. The runner maps its ids, seals the worker's file systems
read-only under fresh tmpfs /tmp and /dev/shm (bounded in bytes and in files) and an empty
read-only /dev/pts (no pseudo-terminal: a filled tty buffer is host kernel memory no cgroup pays
for), mounts its own /proc read-only (no program writes its autogroup, or any other /proc file),
drops every capability, sets no_new_privs, then waits for its job and runs `harness.run_job`
(per-test fork, rlimits, seccomp, limits summed over the test, everything killed between tests).
The server starts each runner right after answering the previous job, so a job pays only for its
tests. The server enforces the job's wall clock and output cap, then kills PID 1, which takes down
everything the program started (setsid included), and only then answers. Nothing a job leaves
(processes, files, SysV or POSIX IPC objects, sockets) outlives it, and a job cannot name, signal
or trace the server: it lives in the parent namespaces. The server itself is PID 1 of the
worker's namespace (bwrap --as-pid-1).

Every wait is bounded, so a job always gets an answer, and a slow one is a timeout, never a
broken worker: the server gives each test until its wall-clock backstop (plus a little) to
report, from outside the job's namespace where nothing the program does can slow its clock,
and kills the job when a record is late; after the kill it waits at most KILL_WAIT_S for PID 1
before answering (a namespace whose processes are slow to die finishes dying after the answer).
The server reaps each runner as it exits, from its SIGCHLD handler, so none waits as a zombie
for the next job (issue #57). One process a job outside the program's own, not two: a supervisor
forked to create the namespaces (os.fork cannot start a child in a new PID namespace) cost about
a fifth of a job's CPU, most of it copying and unmapping a Python process's pages.

Protocol on stdin/stdout: frames of a 4-byte big-endian length and a UTF-8 JSON object, never
pickle: the worker's settings in and a hello out, then one job in and one answer out, repeated.
Stdlib only and run from source: the pool's boot code loads the harness and its helpers first,
then this, then calls `serve`. It isolates nothing from the host by itself; bubblewrap and the
sandbox uid do that.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import select
import signal
import struct
import time
import traceback
from typing import NamedTuple

import harness  # put in sys.modules by the pool's boot code: this file runs only in the sandbox
import seccomp_filter

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x4000000, 0x8000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
JOB_NAMESPACES = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWUTS
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
CAPABILITY_VERSION_3 = 0x20080522
HEADER = struct.Struct(">I")
STDERR_TAIL_BYTES = 4096
CHANNEL_FD = 3  # the runner's record pipe; the job arrives on the next fd, all others are closed
RECORD_SLACK_S = 1.0  # past a test's backstop: killing and reaping its processes, then the next fork
KILL_WAIT_S = 2.0  # how long the answer waits for a killed job's PID 1 to be gone
PR_SET_PDEATHSIG = 1
CLONE_PIDFD = 0x1000
SYS_CLONE3 = 435  # one number on every architecture (the syscalls added since Linux 5.3 share a table)
# clone, where clone3 is refused: its number where its third argument is the parent's tid (CLONE_PIDFD's slot)
SYS_CLONE = {"x86_64": 56, "aarch64": 220, "riscv64": 220}.get(os.uname().machine)
# warm in the server, so a program's `import` of these costs a dict lookup in its forked child
PRELOADED = ("bisect", "collections", "fractions", "functools", "heapq", "itertools", "math", "re", "string")
SCRATCH = ("/tmp", "/dev/shm")  # the job's own tmpfs mounts: its files count against its memory
SEALED = "/dev/pts"  # bubblewrap's devpts instance, covered by an empty read-only tmpfs in each job

_libc = ctypes.CDLL(None, use_errno=True)
_python = ctypes.PyDLL(None, use_errno=True)  # its calls keep the GIL, as os.fork does across the fork
_python.syscall.restype = ctypes.c_long
_exited: dict[int, int] = {}  # wait statuses the SIGCHLD handler collected, kept for the current jail's
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def serve() -> None:
    """Read the worker's settings, then answer one frame per job until the pool closes stdin."""
    inbox, outbox = os.dup(0), os.dup(1)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1):  # a stray print can never corrupt the framing
        os.dup2(null, fd)
    os.close(null)
    raw = _receive(inbox)
    if raw is None:
        return
    settings = json.loads(raw)
    if settings["reuse"]:  # warm once per worker, inherited by every job's runner
        for name in PRELOADED:
            __import__(name)
    if seccomp_filter.unsupported() is None:
        seccomp_filter.compiled()
    tmpfs = f"size={settings['tmpfs_bytes']},nr_inodes={settings['tmpfs_files']},mode=0700"
    # a runner killed after its answer may still be dying: reaped whenever it exits
    signal.signal(signal.SIGCHLD, _reap)
    jail = _prepare_jail(tmpfs, private=(inbox, outbox))
    _send(outbox, {"event": "hello"})
    while (job := _receive(inbox)) is not None:
        _send(outbox, _run(jail, job))
        if not settings["reuse"]:
            return
        # the next job's jail is built while the pool reads this answer
        jail = _prepare_jail(tmpfs, private=(inbox, outbox))
        for pid in list(_exited):  # one C call: the handler cannot run inside it
            if pid != jail.pid:
                _exited.pop(pid, None)


def _reap(signum: int, frame: object) -> None:
    """SIGCHLD: reap every child that has exited (the runners, each once its namespace is gone)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _exited[pid] = status


def _wait(pid: int) -> int:
    """The wait status of child `pid`, whether the SIGCHLD handler reaps it or this call does."""
    while pid not in _exited:
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            pass  # the handler reaped it meanwhile: its status is in _exited
    return _exited.pop(pid)


def _receive(fd: int) -> bytes | None:
    header = _read_exactly(fd, HEADER.size)
    return None if header is None else _read_exactly(fd, HEADER.unpack(header)[0])


def _read_exactly(fd: int, n: int) -> bytes | None:
    data = bytearray()
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _read_all(fd: int) -> bytes:
    data = bytearray()
    while chunk := os.read(fd, 1 << 20):
        data += chunk
    os.close(fd)
    return bytes(data)


def _send(fd: int, message: dict) -> None:
    body = json.dumps(message).encode()
    _write_all(fd, HEADER.pack(len(body)) + body)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


class Jail(NamedTuple):
    """A runner waiting for its job: its pid and pidfd, the pipe its job goes in, and its records' and stderr's."""

    pid: int
    pidfd: int
    job_w: int
    out_r: int
    err_r: int


def _clone_into_namespaces() -> tuple[int, int]:
    """os.fork, with the child started in fresh namespaces (JOB_NAMESPACES): (pid, pidfd) in the parent, (0, -1)
    in the child. os.fork cannot start a child in a new PID namespace, and unshare does not move its caller into
    one: without clone3 each job would need a second process outside its PID namespace to watch it.

    Python's own fork hooks run as os.fork runs them; glibc's do not, which is safe in this single-threaded
    server (no lock can be held by another thread). The child's glibc keeps the server's cached thread id (1:
    the server is PID 1 of the worker), which is also the child's own, as PID 1 of its namespace."""
    pidfd = ctypes.c_int(-1)
    flags = JOB_NAMESPACES | CLONE_PIDFD
    args = (ctypes.c_uint64 * 11)(flags, ctypes.addressof(pidfd), 0, 0, signal.SIGCHLD)
    ctypes.pythonapi.PyOS_BeforeFork()
    call = "clone3"
    pid = _python.syscall(ctypes.c_long(SYS_CLONE3), ctypes.byref(args), ctypes.c_long(ctypes.sizeof(args)))
    if pid < 0 and ctypes.get_errno() == errno.ENOSYS and SYS_CLONE is not None:
        # a container's seccomp profile may refuse clone3, whose flags it cannot inspect, and allow clone
        call = "clone"
        pid = _python.syscall(ctypes.c_long(SYS_CLONE), ctypes.c_long(flags | signal.SIGCHLD), ctypes.c_long(0),
                              ctypes.byref(pidfd), ctypes.c_long(0), ctypes.c_long(0))
    if pid == 0:
        ctypes.pythonapi.PyOS_AfterFork_Child()
        return 0, -1
    failure = ctypes.get_errno()
    ctypes.pythonapi.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(failure, f"job sandbox: cannot start a job in fresh namespaces ({call}): {os.strerror(failure)}")
    return pid, pidfd.value


def _prepare_jail(tmpfs: str, private: tuple[int, ...]) -> Jail:
    """Start the next job's runner, PID 1 of fresh namespaces, which builds its jail and waits for its job."""
    handoff_r, handoff_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    uid, gid = os.getuid(), os.getgid()  # in the child, the overflow ids until it maps them
    pid, pidfd = _clone_into_namespaces()
    if pid == 0:
        try:
            os.dup2(err_w, 2)  # from here on, a traceback of the runner reaches the reply
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server's reaper is not the runner's
            # the job dies with the server, whatever ends the server
            _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "set the parent-death signal")
            for fd in (*private, handoff_w, out_r, err_r):
                os.close(fd)
            _map_ids(uid, gid)
            _seal_file_systems(tmpfs)
            _runner(handoff_r, out_w, err_w)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(harness.EXIT_CRASH)
    for fd in (handoff_r, out_w, err_w):
        os.close(fd)
    return Jail(pid, pidfd, handoff_w, out_r, err_r)


def _run(jail: Jail, data: bytes) -> dict:
    """Hand the job to its waiting runner, collect its records under the job's clock, kill the job, answer.

    The runner is PID 1 of the job's namespace: killing it kills everything else there, and it is gone once
    they all are. The answer waits for that at most KILL_WAIT_S; a namespace slow to die is reaped later by
    the SIGCHLD handler."""
    job = json.loads(data)
    try:
        _write_all(jail.job_w, data)
    except BrokenPipeError:
        pass  # the runner died before reading its job: no 'ready' record, its stderr says why
    os.close(jail.job_w)
    per_record_s = job["backstop_s"] + RECORD_SLACK_S
    out, err, ended = _collect(jail.out_r, jail.err_r, job["budget_s"], per_record_s, job["max_reply_bytes"])
    try:
        signal.pidfd_send_signal(jail.pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass  # it exited (its namespace with it) and the SIGCHLD handler reaped it
    gone = bool(select.select([jail.pidfd], [], [], KILL_WAIT_S)[0])
    os.close(jail.pidfd)
    return {
        "event": "done",
        "out": out.decode("utf-8", "replace"),
        "err": err.decode("utf-8", "replace"),
        "ended": ended,
        # not gone yet: it was killed, and the answer does not wait for the rest of its namespace
        "exit_status": os.waitstatus_to_exitcode(_wait(jail.pid)) if gone else -signal.SIGKILL,
    }


def _map_ids(uid: int, gid: int) -> None:
    """In the job's fresh user namespace, stay the worker's uid and gid, and never gain other groups."""
    for name, text in (("uid_map", f"{uid} {uid} 1"), ("setgroups", "deny"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def _seal_file_systems(tmpfs: str) -> None:
    """Everything the worker could write becomes read-only; the job writes only to fresh tmpfs (`tmpfs` options)."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    for path in ("/", "/dev"):  # bubblewrap's root and /dev are tmpfs shared by all jobs
        # nosuid and nodev are locked on by bubblewrap: a remount must repeat them
        _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    for path in SCRATCH:
        _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, tmpfs)
    if os.path.isdir(SEALED):  # /dev/ptmx is a link into it: no pseudo-terminal can be made
        _mount("tmpfs", SEALED, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,nr_inodes=2,mode=0555")
    os.chdir("/tmp")


def _runner(handoff_r: int, out_w: int, err_w: int) -> None:
    """PID 1 of the job: own /proc, no capabilities, then the job's tests; never returns."""
    os.setsid()
    # PID 1 ignores a signal its own namespace sends only while the action is the default one
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    harness.first_for_the_oom_killer()  # through the worker's /proc, before ours hides it read-only
    _mount("proc", "/proc", "proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _drop_capabilities()
    # lift the three above the targets first, so no dup2 overwrites one still to be moved
    lifted = [fcntl.fcntl(fd, fcntl.F_DUPFD, 16) for fd in (err_w, out_w, handoff_r)]
    for target, fd in zip((2, CHANNEL_FD, CHANNEL_FD + 1), lifted):
        os.dup2(fd, target)
    os.closerange(CHANNEL_FD + 2, os.sysconf("SC_OPEN_MAX"))
    job = json.loads(_read_all(CHANNEL_FD + 1))
    harness.run_job(job, CHANNEL_FD, close_in_child=(CHANNEL_FD,), scratch=SCRATCH)
    os._exit(0)


def _drop_capabilities() -> None:
    """Give up what the fresh user namespace granted, for good: bounding set, capset, no_new_privs."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last_cap = int(f.read())
    for cap in range(last_cap + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap} from the bounding set")
    header = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0)
    _check(_libc.capset(header, (ctypes.c_uint32 * 6)()), "clear capabilities")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "set no_new_privs")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(_c(source), target.encode(), _c(fstype), flags, _c(data)), f"mount {target}")


def _c(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _check(result: int, what: str) -> None:
    if result != 0:
        failure = ctypes.get_errno()
        raise OSError(failure, f"job sandbox: cannot {what}: {os.strerror(failure)}")


def _collect(out_r: int, err_r: int, budget_s: float, per_record_s: float, cap: int) -> tuple[bytes, bytes, str]:
    """Read the runner's records and stderr tail until EOF, the byte cap, the job's wall clock, or a
    record (one line each) later than `per_record_s` after the one before."""
    job_deadline = time.monotonic() + budget_s
    record_deadline = time.monotonic() + per_record_s
    bufs = {out_r: bytearray(), err_r: bytearray()}
    poller = select.poll()
    for fd in bufs:
        poller.register(fd, select.POLLIN)
    open_fds = set(bufs)
    ended = "exited"
    while open_fds and ended == "exited":
        remaining = min(job_deadline, record_deadline) - time.monotonic()
        if remaining <= 0:
            ended = "timeout"
            break
        for fd, _ in poller.poll(remaining * 1000):
            chunk = os.read(fd, 65536)
            if not chunk:
                poller.unregister(fd)
                open_fds.discard(fd)
                continue
            bufs[fd] += chunk
            if fd == err_r:
                del bufs[fd][:-STDERR_TAIL_BYTES]
            elif len(bufs[fd]) > cap:
                ended = "output_limit"
            elif b"\n" in chunk:
                record_deadline = time.monotonic() + per_record_s
    for fd in bufs:
        os.close(fd)
    return bytes(bufs[out_r]), bytes(bufs[err_r]), ended

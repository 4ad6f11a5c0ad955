"""A seccomp filter for the untrusted program: the system calls no test needs and an attack would.

The runner that keeps the clock and writes the verdict is out of the program's reach already
(it is PID 1 of the job's namespace and not dumpable, so /proc/1/fd, ptrace and pidfd_getfd are
refused by the kernel's ptrace-access check). This filter is a second layer on the same classes
and closes what that check does not cover:

- reaching another process: ptrace, process_vm_readv/writev, pidfd_getfd, process_madvise;
- memory that no process maps, so no per-process limit counts it: memfd_create, memfd_secret,
  SysV shared memory, message queues and semaphores, POSIX message queues;
- kernel attack surface a test never needs: keyctl, bpf, userfaultfd, perf_event_open,
  io_uring, syslog;
- Linux AIO (io_setup and the calls on its contexts): a context's events count against the
  machine's fs.aio-max-nr, which no cgroup bounds; one job held all 65,536 (issue #57);
- per-user kernel objects whose count the job's user namespace charges to the host's user:
  inotify and fanotify instances (128 per user here, fs.inotify.max_user_instances: one job could
  take them all from the trainer beside it) and POSIX timers (each holds a queued signal of the
  user's RLIMIT_SIGPENDING); a test times itself with setitimer or the clock, which stay open;
- becoming dumpable again (prctl PR_SET_DUMPABLE): a dumpable process owns its /proc files, and
  could write its autogroup's nice (the jail's /proc is read-only as well);
- leaving the jail's shape: mount and the new mount API, pivot_root, chroot, unshare, setns,
  and clone with any namespace flag (clone3 answers ENOSYS, so libc falls back to clone, whose
  flags a filter can read);
- sockets other than unix ones: the job's network namespace has nothing to reach, and unix
  sockets are the kind whose buffers the runner can measure (`job_meter.py`);
- setsid: every process of a test stays in the test's session, which is one scheduling
  autogroup, so a hundred busy processes get one share of the CPU, not a hundred;
- the runner's clock and meter: a process may change only its own scheduling and limits
  (setpriority, sched_setaffinity, ioprio_set and prlimit64 on pid 0 only; no scheduling policy
  at all), so nothing it runs can demote, pin or starve the runner (issue #37);
- CPU time that leaves no trace: SIGCHLD may not be set (to SIG_IGN or SA_NOCLDWAIT, whose children
  the kernel reaps without adding their CPU time to anyone's), so every process a test starts is
  either alive, a zombie, or reaped by a process of the test, whose counters then hold its time;
- pipes as a memory store: splice, vmsplice, tee, sendfile and F_SETPIPE_SZ, which put pages of any
  size into a pipe or grow one; left with write(), a pipe holds at most 16 pages of 4 KB.

Denied calls fail with EPERM; a call from another ABI (x32, or int 0x80 on x86_64) kills the
process, since the numbers above would not apply to it. The filter is hand-written classic BPF
(stdlib and ctypes only: it runs inside the jail, from source) for x86_64 and aarch64; on any
other machine `unsupported()` says so and the layers report shows seccomp off.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import struct

# the calls denied, with their numbers on x86_64 and on aarch64 (asm-generic)
DENIED = {
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438),
    "process_madvise": (440, 440),
    "memfd_create": (319, 279),
    "memfd_secret": (447, 447),
    "shmget": (29, 194),
    "msgget": (68, 186),
    "semget": (64, 190),
    "mq_open": (240, 180),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "bpf": (321, 280),
    "userfaultfd": (323, 282),
    "perf_event_open": (298, 241),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "syslog": (103, 116),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "unshare": (272, 97),
    "setns": (308, 268),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "setsid": (112, 157),
    "sched_setscheduler": (144, 119),
    "sched_setparam": (142, 118),
    "sched_setattr": (314, 274),
    "splice": (275, 76),
    "vmsplice": (278, 75),
    "tee": (276, 77),
    "sendfile": (40, 71),
    "io_setup": (206, 0),
    "io_destroy": (207, 1),
    "io_submit": (209, 2),
    "io_cancel": (210, 3),
    "io_getevents": (208, 4),
    "io_pgetevents": (333, 292),
    "inotify_init": (253, 26),  # aarch64 has inotify_init1 alone: its number twice
    "inotify_init1": (294, 26),
    "fanotify_init": (300, 262),
    "timer_create": (222, 107),
}
CLONE = (56, 220)
CLONE3 = (435, 435)
SOCKET = (41, 198)
# calls allowed only when they name the caller itself: (numbers, ((argument, required value), ...));
# pid 0 (and PRIO_PROCESS 0, IOPRIO_WHO_PROCESS 0) is the caller, and a pid_t is an argument's low word
SELF_ONLY = {
    "setpriority": ((141, 140), ((0, 0), (1, 0))),  # which = PRIO_PROCESS, who = 0
    "ioprio_set": ((251, 30), ((0, 1), (1, 0))),  # which = IOPRIO_WHO_PROCESS, who = 0
    "sched_setaffinity": ((203, 122), ((0, 0),)),
    "prlimit64": ((302, 261), ((0, 0),)),
}
RT_SIGACTION = (13, 134)
FCNTL = (72, 25)
PRCTL = (157, 167)
SIGCHLD = 17
F_SETPIPE_SZ = 1031
PR_SET_DUMPABLE = 4
# machine -> (AUDIT_ARCH_*, column in the tables above)
ARCHES = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}
X32_SYSCALL_BIT = 0x40000000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (0x80, NEWTIME, is the
# exit-signal byte in clone's flags and is refused by clone itself)
CLONE_NAMESPACES = 0x7E020000
AF_UNIX = 1

BPF_LD_W_ABS, BPF_JEQ, BPF_JGE, BPF_JSET, BPF_RET = 0x20, 0x15, 0x35, 0x45, 0x06
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
OFFSET_NR, OFFSET_ARCH = 0, 4  # struct seccomp_data
ARG_WORDS = 16  # seccomp_data.args[0]; each argument is 8 bytes, low word first (little-endian)
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
Instruction = tuple[int, "str | None", "str | None", int]  # (code, label if true, label if false, k)


def unsupported() -> str | None:
    """None where this module has the machine's system call numbers, else why not (one line)."""
    machine = os.uname().machine
    if machine not in ARCHES:
        return f"no system call table for {machine} (x86_64 and aarch64 only)"
    if struct.pack("=I", 1) != struct.pack("<I", 1):
        return "big-endian machine: the filter reads clone's flags as little-endian"
    return None


def program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter for `machine` as (code, jump-if-true, jump-if-false, k) instructions."""
    audit_arch, column = ARCHES[machine]
    blocks: dict[str, list[Instruction]] = {
        "start": [
            (BPF_LD_W_ABS, None, None, OFFSET_ARCH),
            (BPF_JEQ, None, "kill", audit_arch),
            (BPF_LD_W_ABS, None, None, OFFSET_NR),
            *([(BPF_JGE, "kill", None, X32_SYSCALL_BIT)] if machine == "x86_64" else []),
            *[(BPF_JEQ, "deny", None, numbers[column]) for numbers in DENIED.values()],
            *[(BPF_JEQ, name, None, numbers[column]) for name, (numbers, _) in SELF_ONLY.items()],
            (BPF_JEQ, "rt_sigaction", None, RT_SIGACTION[column]),
            (BPF_JEQ, "fcntl", None, FCNTL[column]),
            (BPF_JEQ, "prctl", None, PRCTL[column]),
            (BPF_JEQ, "enosys", None, CLONE3[column]),
            (BPF_JEQ, "clone", None, CLONE[column]),
            (BPF_JEQ, "socket", "allow", SOCKET[column]),
        ],
        # clone: no namespace flag
        "clone": [(BPF_LD_W_ABS, None, None, _arg(0)), (BPF_JSET, "deny", "allow", CLONE_NAMESPACES)],
        # socket: unix sockets only (the job's network namespace has nothing else to reach)
        "socket": [(BPF_LD_W_ABS, None, None, _arg(0)), (BPF_JEQ, "allow", "deny", AF_UNIX)],
        **{name: _all_equal(required) for name, (_, required) in SELF_ONLY.items()},
        # rt_sigaction: SIGCHLD may be read (act == NULL), never set
        "rt_sigaction": [
            (BPF_LD_W_ABS, None, None, _arg(0)),
            (BPF_JEQ, None, "allow", SIGCHLD),
            (BPF_LD_W_ABS, None, None, _arg(1)),
            (BPF_JEQ, None, "deny", 0),
            (BPF_LD_W_ABS, None, None, _arg(1) + 4),
            (BPF_JEQ, "allow", "deny", 0),
        ],
        "fcntl": [(BPF_LD_W_ABS, None, None, _arg(1)), (BPF_JEQ, "deny", "allow", F_SETPIPE_SZ)],
        "prctl": [(BPF_LD_W_ABS, None, None, _arg(0)), (BPF_JEQ, "deny", "allow", PR_SET_DUMPABLE)],
        "allow": [(BPF_RET, None, None, RET_ALLOW)],
        "deny": [(BPF_RET, None, None, RET_ERRNO | errno.EPERM)],
        "enosys": [(BPF_RET, None, None, RET_ERRNO | errno.ENOSYS)],
        "kill": [(BPF_RET, None, None, RET_KILL_PROCESS)],
    }
    at, size = {}, 0
    for name, block in blocks.items():
        at[name], size = size, size + len(block)
    out = []
    for code, jt, jf, k in (ins for block in blocks.values() for ins in block):
        here = len(out)
        jumps = [0 if label is None else at[label] - here - 1 for label in (jt, jf)]
        assert all(0 <= j <= 255 for j in jumps), "a seccomp jump is out of range"
        out.append((code, *jumps, k))
    return out


def _arg(n: int) -> int:
    """Offset of argument `n`'s low word in struct seccomp_data."""
    return ARG_WORDS + 8 * n


def _all_equal(required: tuple[tuple[int, int], ...]) -> list[Instruction]:
    """Allow when every (argument, value) holds on the argument's low word, else deny."""
    block: list[Instruction] = []
    for i, (arg, value) in enumerate(required):
        last = i == len(required) - 1
        block += [(BPF_LD_W_ABS, None, None, _arg(arg)), (BPF_JEQ, "allow" if last else None, "deny", value)]
    return block


class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_Filter))]


@functools.cache
def compiled() -> tuple[ctypes.CDLL, _Program, ctypes.Array]:
    """libc and the filter, built once per process: the runner warms it, each forked test reuses it."""
    why = unsupported()
    if why is not None:
        raise OSError(errno.ENOSYS, f"seccomp filter: {why}")
    instructions = program(os.uname().machine)
    filters = (_Filter * len(instructions))(*(_Filter(*ins) for ins in instructions))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    return libc, _Program(len(instructions), filters), filters  # the array must outlive the program


def install() -> None:
    """Filter this process and every process it starts from now on; raises OSError if it cannot."""
    libc, prog, _ = compiled()
    for option, arg, pointer in (
        (PR_SET_NO_NEW_PRIVS, 1, None),
        (PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog)),
    ):
        if libc.prctl(option, arg, pointer, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"seccomp filter: prctl({option}) failed: {os.strerror(err)}")

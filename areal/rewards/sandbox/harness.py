"""The test runner inside the sandbox: each test of one program in a forked child, and what it produced.

The one idea: this side only *runs* the program and reports what it produced; it never sees the
expected outputs, and it writes its records to a channel no process of the program can reach.
The trusted parent compares.

The program runs in a forked child, as the same uid, so it holds a copy of this process's
memory. Why it still cannot write the verdict, nor stop the clock:
- nothing in that memory is worth taking: the records carry no secret, and the channel's fd is
  closed in the child before the program runs;
- this process is not dumpable, so the kernel refuses the program /proc/PID/fd, /proc/PID/mem,
  ptrace, process_vm_* and pidfd_getfd on it; the seccomp filter (`seccomp_filter.py`), which
  each test installs on itself before the program is even compiled, denies those calls too;
- in the pooled path this process is PID 1 of the job's PID namespace, which the kernel shields
  from every signal its own namespace sends without a handler, SIGSTOP and SIGKILL included;
- a test's time is judged on what was measured, not on when this process woke up: CPU seconds
  of every process the test started, reaped or not, and this process's own while it watched
  (reading a stderr dripped a byte at a time is the program's doing: issue #57) (`job_meter.py`),
  and wall time minus the time its first process waited for a CPU at its starting priority (so
  a neighbour's load does not turn a correct program into a timeout, and a program that demotes
  itself gains nothing), with a wall-clock backstop (`backstop_s`) for a machine so loaded that
  even that is unfair;
- nothing it runs can demote, pin or re-limit this process (the filter allows the scheduling and
  limit calls on the caller only), and the server outside the namespace ends a test whose
  record is late, whatever happened to this process (`sandbox_server.py`).

Each test runs in a child that takes a session of its own (one CPU autogroup, apart from this
process's, so nothing it does to it slows the runner), then rlimits and the filter, which denies
setsid from then on, then compiles the program (the compile is the program's work, under its
limits: issue #57) and runs it, its input through a pipe, the job's limits summed over all its
processes (`job_meter.py`), its stderr counted against the output cap. When the test ends,
every process it started is killed (as PID 1: everything in the namespace but this process,
setsid or not; on the plain path, where this process is a subreaper, the test's session and this
process's children) and reaped before the next test starts. A record says how a test ended in
the program's terms; the host refuses any other status, so nothing from here can report a
machinery failure.

Stdlib only, run from source next to its helpers `seccomp_filter`, `job_meter` and `harness_child`
(what each forked test runs): the pooled worker (`sandbox_server.py`) calls `run_job` once per job,
the plain path runs `main` once. It isolates nothing from the host by itself (bubblewrap, the
per-job namespaces and the uid do).
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import resource
import select
import signal
import sys
import time

import job_meter  # put in sys.modules by the boot code: this file runs only in the sandbox
import seccomp_filter
from harness_child import EXIT_BAD_RESULT, EXIT_CRASH, EXIT_MEMORY, run_program

STDERR_TAIL_BYTES = 4096  # kept for the detail line; the whole of it counts against the output cap
TICK_S = 0.05  # how often a running test's processes are measured
CPUS = len(os.sched_getaffinity(0))  # a test cannot spend more CPU seconds than this per second
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36

_libc = ctypes.CDLL(None, use_errno=True)


def main() -> None:
    """Plain-path entry: read one job from stdin, report on stdout, exit."""
    first_for_the_oom_killer()
    job = json.loads(sys.stdin.buffer.read())
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    channel = os.dup(1)
    os.dup2(null, 1)
    run_job(job, channel, close_in_child=(channel, null), scratch=())


def run_job(job: dict, channel: int, close_in_child: tuple[int, ...], scratch: tuple[str, ...]) -> None:
    """Run each test in a forked child and write one record per test to `channel`.

    `scratch` are the job's own tmpfs mounts, whose files count against its memory. The caller has
    made this process `first_for_the_oom_killer`.
    """
    _set_dumpable(False)  # before any child exists: see the module docstring
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    whole_namespace = os.getpid() == 1
    if not whole_namespace:  # orphans of the test come to us, not to the host's init, which would reap them
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    # a SIGCHLD ignored here would be inherited, and every test's children reaped by the kernel
    # uncounted; the filter then refuses any process of the job to set it
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # opened here, as the tests' filter allows unix sockets only; the plain path's would be the host's
    sockets = job_meter.UnixSockets() if whole_namespace else None
    close_in_child = (*close_in_child, *([sockets.fileno()] if sockets else []))
    if job["seccomp"]:
        # built once, here: each forked test installs it on itself, after leaving this session
        seccomp_filter.compiled()

    def emit(record: dict) -> None:
        data = (json.dumps(record) + "\n").encode()
        while data:
            data = data[os.write(channel, data) :]

    # 'ready' before the program is even compiled: from here on, whatever goes wrong is the program's
    emit({"event": "ready"})
    meter = functools.partial(job_meter.JobMeter, whole_namespace=whole_namespace, scratch=scratch, sockets=sockets)
    cgroup_cpu = job.get("cgroup_cpu")  # the worker cgroup's CPU counter, where it has one
    for i, test_input in enumerate(job["inputs"]):
        clock = job_meter.CgroupCpu(cgroup_cpu) if cgroup_cpu else None
        record = _run_test(job["code"], test_input, job, close_in_child, functools.partial(meter, cgroup=clock))
        if record["status"] == "syntax_error":
            if i == 0:  # each test compiles the program: the first says it does not, for all of them
                emit({"event": "syntax_error", "detail": record["detail"]})
                return
            record["status"] = "crash"  # cannot be: one source compiles one way (kept for safety)
        record["i"] = i
        emit(record)


def first_for_the_oom_killer() -> None:
    """This process, and every process it forks, first in line for the OOM killer, before the worker
    or the host. Written while /proc/self is still writable and ours: an undumpable process's files
    belong to root, and the job's own /proc is read-only."""
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")


def _set_dumpable(dumpable: bool) -> None:
    _prctl(PR_SET_DUMPABLE, int(dumpable))


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def _run_test(source: str, test_input, job: dict, close_in_child: tuple[int, ...], meter_of) -> dict:
    """One test in a forked child; `meter_of(pid)` measures the processes it starts."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    res_r, res_w = os.pipe()
    stdin_r, stdin_w = os.pipe()  # fed by `_watch`: a pipe needs no call the filter denies
    compile_r, compile_w = os.pipe()  # why the program did not compile, closed before it runs
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            for fd in (*close_in_child, out_r, err_r, res_r, stdin_w, compile_r):
                os.close(fd)
            run_program(source, test_input, job, stdin_r, out_w, err_w, res_w, compile_w)
        finally:
            os._exit(EXIT_CRASH)
    for fd in (out_w, err_w, res_w, stdin_r, compile_w):
        os.close(fd)
    meter = meter_of(pid)
    stdin = str(test_input).encode() if job["kind"] == "stdio" else b""
    record = _watch(meter, started, (stdin_w, stdin), out_r, err_r, res_r, job)
    # every process that held its write end is gone by now
    why = os.read(compile_r, 4096).decode("utf-8", "replace")
    os.close(compile_r)
    return {"status": "syntax_error", "detail": why} if why else record


def _watch(
    meter: job_meter.JobMeter, started: float, stdin: tuple[int, bytes], out_r: int, err_r: int, res_r: int, job: dict
) -> dict:
    """Feed the test its input and wait for it under its limits and the output cap; end all it
    started; report how it ended. `stdin` is (the write end of its stdin, the bytes to write)."""
    cap, limit_s, backstop_s = job["max_output_bytes"], job["timeout_s"], job["backstop_s"]
    pidfd = os.pidfd_open(meter.pid)
    bufs = {out_r: bytearray(), err_r: bytearray(), res_r: bytearray()}
    err_bytes = 0  # all it wrote to stderr, of which `bufs` keeps the tail
    poller = select.poll()
    for fd in (*bufs, pidfd):
        poller.register(fd, select.POLLIN)
    stdin_w, pending = stdin
    os.set_blocking(stdin_w, False)
    if pending := _feed(stdin_w, pending):
        poller.register(stdin_w, select.POLLOUT)
    verdict, detail, next_tick = None, "", TICK_S
    while verdict is None:
        elapsed = time.monotonic() - started
        if elapsed >= next_tick:
            verdict, detail = _over_limits(meter, job)
            next_tick = elapsed + TICK_S
            if verdict is not None:
                break
        left_s = limit_s - _unqueued_s(meter, elapsed, limit_s)
        if left_s <= 0 or elapsed >= backstop_s:
            verdict, detail = "timeout", _wall_detail(elapsed, limit_s, backstop_s)
            break
        wait_s = min(next_tick - elapsed, left_s, backstop_s - elapsed)
        for fd, _ in poller.poll(max(wait_s, 0.001) * 1000):
            if fd == pidfd:
                verdict = "exited"
                continue
            if fd == stdin_w:
                if not (pending := _feed(stdin_w, pending)):
                    poller.unregister(stdin_w)
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                poller.unregister(fd)
                continue
            bufs[fd] += chunk
            if fd == err_r:
                err_bytes += len(chunk)
                del bufs[fd][:-STDERR_TAIL_BYTES]
            if len(bufs[fd]) > cap or err_bytes > cap:
                verdict = "output_limit"
    if verdict == "exited":
        # judged on what it used, not on when this process noticed: see the module docstring
        elapsed = time.monotonic() - started
        if _unqueued_s(meter, elapsed, limit_s) > limit_s:
            verdict, detail = "timeout", _wall_detail(elapsed, limit_s, backstop_s)
        elif elapsed * CPUS > limit_s and (cpu_s := meter.cpu_s(meter.processes())) > limit_s:
            verdict, detail = "timeout", _cpu_detail(cpu_s, limit_s)
        elif (left := meter.dentry_bytes()) > job["memory_mb"] << 20:  # they outlive the test's processes
            verdict, detail = "memory", _memory_detail(left, left, job["memory_mb"])
    wait_status = _end_test(meter)
    if pending:
        os.close(stdin_w)
    for fd in bufs:
        _drain(fd, bufs[fd], cap)
    for fd in (*bufs, pidfd):
        os.close(fd)
    if any(len(bufs[fd]) > cap for fd in (out_r, res_r)):
        verdict = "output_limit"
    stderr = bufs[err_r].decode("utf-8", "replace")
    out = (bufs[res_r] if job["kind"] == "call" else bufs[out_r]).decode("utf-8", "replace")
    if verdict == "output_limit":
        return {"status": verdict, "detail": f"more than {cap} bytes of output"}
    if verdict in ("timeout", "memory"):
        return {"status": verdict, "detail": detail}
    return _classify(wait_status, out, stderr, job["kind"])


def _feed(fd: int, data: bytes) -> bytes:
    """Write what the pipe takes now; close it once all is written (or nobody reads). Returns the rest."""
    try:
        data = data[os.write(fd, data) :] if data else data
    except BlockingIOError:
        return data
    except BrokenPipeError:
        data = b""
    if not data:
        os.close(fd)
    return data


def _unqueued_s(meter: job_meter.JobMeter, elapsed: float, limit_s: float) -> float:
    """Wall time the test did not spend queued for a CPU; read only once the wall time alone passes the limit."""
    return elapsed if elapsed <= limit_s else elapsed - meter.queued_s()


def _wall_detail(elapsed: float, limit_s: float, backstop_s: float) -> str:
    if elapsed >= backstop_s:
        return f"still running after {backstop_s:g} s of wall time (the backstop)"
    return f"still running after {limit_s:g} s"


def _cpu_detail(cpu_s: float, limit_s: float) -> str:
    return f"its processes used {cpu_s:.2f} s of CPU, over the {limit_s:g} s limit"


def _over_limits(meter: job_meter.JobMeter, job: dict) -> tuple[str | None, str]:
    """('timeout' | 'memory' | None, why) from one measurement of all the test's processes."""
    pids = meter.processes()
    if (cpu_s := meter.cpu_s(pids)) > job["timeout_s"]:
        return "timeout", _cpu_detail(cpu_s, job["timeout_s"])
    dentries = meter.dentry_bytes()
    if (held := meter.memory_bytes(pids) + dentries) > job["memory_mb"] << 20:
        return "memory", _memory_detail(held, dentries, job["memory_mb"])
    return None, ""


def _memory_detail(held: int, dentries: int, memory_mb: int) -> str:
    of_it = f" (the negative dentries its lookups left: {dentries >> 20} MB)" if dentries >> 20 else ""
    return f"its processes and files held {held >> 20} MB{of_it}, over the job's {memory_mb} MB"


def _end_test(meter: job_meter.JobMeter) -> int:
    """Kill every process the test started, reap them, and return the test's first process's wait status."""
    _kill_all(meter)
    _, wait_status = os.waitpid(meter.pid, 0)
    while True:
        # orphans are this process's children (PID 1, or a subreaper on the plain path): reap them
        # all, killing again whatever forked meanwhile
        _kill_all(meter)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    return wait_status


def _kill_all(meter: job_meter.JobMeter) -> None:
    if meter.whole_namespace:
        _quietly(os.kill, -1, signal.SIGKILL)  # as PID 1: every other process of the namespace
    else:
        for pid in meter.processes():  # the plain path: the test's session, which it cannot leave, and our children
            _quietly(os.kill, pid, signal.SIGKILL)


def _quietly(kill, target: int, sig: int) -> None:
    try:
        kill(target, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _drain(fd: int, buf: bytearray, cap: int) -> None:
    os.set_blocking(fd, False)
    while len(buf) <= cap:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        if not chunk:
            return
        buf += chunk


def _classify(wait_status: int, out: str, stderr: str, kind: str) -> dict:
    last_line = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
    if os.WIFSIGNALED(wait_status):
        sig = os.WTERMSIG(wait_status)
        status = {
            int(signal.SIGXCPU): "timeout",
            int(signal.SIGXFSZ): "output_limit",
            int(signal.SIGKILL): "killed",
        }
        return {"status": status.get(sig, "crash"), "detail": f"killed by {signal.strsignal(sig) or sig}"}
    code = os.WEXITSTATUS(wait_status)
    if code == EXIT_MEMORY or "MemoryError" in last_line:
        return {"status": "memory", "detail": last_line or "MemoryError"}
    if code == EXIT_BAD_RESULT:
        return {"status": "bad_result", "detail": last_line}
    if code != 0:
        return {"status": "crash", "detail": last_line or f"exit status {code}"}
    if kind == "call" and not out:
        return {"status": "crash", "detail": "exited without returning a result"}
    return {"status": "ok", "out": out}


if __name__ == "__main__":
    main()

"""One started sandbox process, the plain path that runs a program without namespaces, and its records.

`SandboxProcess` starts `python -I -c SOURCE` inside bubblewrap (or, without namespaces, as a
plain process in its own session) and `kill()` ends everything in it: the namespace's PID 1 is
killed through a pidfd, which takes every process it holds, and both bubblewrap and that init
are waited for, so no zombie is left for the host's init. The pool (`pool.py`) runs
programs in these; without namespaces, `run_plain` runs the harness directly, one process per
program. Records are read here and trusted for their framing only: what a record may *say*
is checked by `code_reward.py`.
"""

from __future__ import annotations

import json
import os
import select
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from areal.rewards.sandbox.launch import JAIL_MODULES, as_uid, boot_source, bwrap_argv
from areal.rewards.sandbox.layers import SandboxLayers, SandboxRun
from areal.rewards.sandbox.limits import Limits

STARTUP_SLACK_S = 5.0  # bwrap + interpreter start on a loaded 2-core machine
RECORD_OVERHEAD_BYTES = 4096


def job_payload(job: dict, limits: Limits, layers: SandboxLayers) -> dict:
    """What the harness needs for one program: the job and its limits (no secret: see harness.py)."""
    return {
        **job,
        "timeout_s": limits.timeout_s,
        "backstop_s": limits.backstop_s,
        "memory_mb": limits.memory_mb,
        "max_output_bytes": limits.max_output_bytes,
        "max_file_bytes": limits.max_file_bytes,
        "max_processes": limits.max_processes,
        "max_open_files": limits.max_open_files,
        "seccomp": not layers.seccomp,
        "guard_socket": not layers.namespaces,
    }


def tests_budget_s(limits: Limits, n_tests: int) -> float:
    """Wall clock for running every test of one program, setup not included."""
    return n_tests * (limits.backstop_s + 0.5)


def output_cap(limits: Limits, n_tests: int) -> int:
    """Bytes of records one program's run may send back: each test's output cap, plus framing."""
    return n_tests * (2 * limits.max_output_bytes + RECORD_OVERHEAD_BYTES) + RECORD_OVERHEAD_BYTES


def run_plain(job: dict, limits: Limits, layers: SandboxLayers) -> SandboxRun:
    """Run the harness on one program in a plain process (no namespaces: the weaker opt-in path).

    Without a user namespace of its own, RLIMIT_NPROC counts every thread its uid runs on the
    machine (the trainer's, the user's shell's, other jobs'), so the job's limit is raised by the
    count it finds: it may start `max_processes` more, however busy the account is.
    """
    payload = job_payload(job, limits, layers)
    payload["max_processes"] += threads_of_uid(layers.uid)
    n_tests = len(job["inputs"])
    budget_s = STARTUP_SLACK_S + tests_budget_s(limits, n_tests)
    with SandboxProcess(layers, limits, boot_source(JAIL_MODULES, "harness.main")) as proc:
        try:
            proc.stdin.write(json.dumps(payload).encode())  # type: ignore[union-attr]
            proc.stdin.close()  # type: ignore[union-attr]
        except BrokenPipeError:
            pass  # the sandbox died at start: the run has no 'ready' record and says why
        out, err, ended = _collect(proc, budget_s, output_cap(limits, n_tests))
    return parse_records(out, err, ended, proc.returncode)


def threads_of_uid(uid: int) -> int:
    """Threads whose real uid is `uid` now: what RLIMIT_NPROC counts outside a user namespace."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = dict(line.split(":", 1) for line in Path(entry.path, "status").read_text().splitlines())
        except (OSError, ValueError):
            continue  # gone since the scan, or not ours to read
        if int(fields["Uid"].split()[0]) == uid:
            count += int(fields["Threads"])
    return count


class SandboxProcess:
    """One started sandbox running `source` with piped stdio; `kill()` ends everything in it.
    `cgroup_cpu` is its cgroup's CPU counter, bound into it read-only (see `cgroup.py`)."""

    def __init__(self, layers: SandboxLayers, limits: Limits, source: str, cgroup_cpu: Path | None = None) -> None:
        self.layers, self.workdir = layers, None
        info_r, info_w = os.pipe() if layers.namespaces else (None, None)
        if layers.namespaces:
            assert layers.bwrap is not None
            argv = bwrap_argv(layers.bwrap, layers.python, limits, info_fd=info_w, cgroup_cpu=cgroup_cpu)
            cwd, env = "/", {}
        else:
            self.workdir = tempfile.mkdtemp(prefix="areal-sandbox-")
            if os.geteuid() == 0:
                os.chown(self.workdir, layers.uid, layers.uid)
            argv = [layers.python, "-I"]
            cwd, env = self.workdir, {"PATH": "/usr/bin:/bin", "HOME": self.workdir, "LANG": "C.UTF-8"}
        try:
            self.proc = subprocess.Popen(
                [*argv, "-c", source],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=env,
                start_new_session=True,
                pass_fds=() if info_w is None else (info_w,),
                **as_uid(layers.uid),
            )
        except OSError:
            if info_r is not None:
                os.close(info_r)
            raise
        finally:
            if info_w is not None:
                os.close(info_w)
        self.pid1_fd = _open_pid1(info_r, self.proc) if info_r is not None else None

    def __enter__(self) -> subprocess.Popen:
        return self.proc

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def kill(self) -> None:
        """Kill the sandbox's whole PID namespace (or session) and wait until it is gone."""
        if self.pid1_fd is not None:
            # the namespace's init: the kernel kills every process it holds; this holds even
            # where bwrap itself died first, and is harmless once the harness ended
            _quietly(signal.pidfd_send_signal, self.pid1_fd, signal.SIGKILL)
        elif self.proc.poll() is None:
            _quietly(os.killpg, self.proc.pid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _quietly(os.killpg, self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        if self.pid1_fd is not None:
            # bwrap may exit before its init: wait until the init, and so the namespace, is gone (poll, not
            # select: select refuses an fd past 1023, and an episode worker holds an agent's socket per episode)
            init_gone = select.poll()
            init_gone.register(self.pid1_fd, select.POLLIN)
            init_gone.poll(10_000)
            _reap_if_ours(self.pid1_fd)
            os.close(self.pid1_fd)
            self.pid1_fd = None
        if self.workdir is not None:
            _quietly(os.killpg, self.proc.pid, signal.SIGKILL)
            shutil.rmtree(self.workdir, ignore_errors=True)


def _quietly(kill, target: int, sig: int) -> None:
    try:
        kill(target, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reap_if_ours(pidfd: int) -> None:
    """Reap the namespace's init if it was handed to us (we are PID 1 or a subreaper and bwrap left it)."""
    try:
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
    except ChildProcessError:
        pass  # bwrap reaped it, or our parent's init will


def _open_pid1(info_r: int, proc: subprocess.Popen) -> int | None:
    """A pidfd on the namespace's init, from bwrap's --info-fd (written right after clone)."""
    data = b""
    try:  # several writes, then bwrap closes it; closing early would SIGPIPE bwrap
        while chunk := os.read(info_r, 4096):
            data += chunk
    finally:
        os.close(info_r)
    try:
        pid1_fd = os.pidfd_open(int(json.loads(data)["child-pid"]))
    except (ValueError, KeyError, TypeError, ProcessLookupError):
        return None
    if proc.poll() is not None:  # bwrap gone: the pid may name another process by now
        os.close(pid1_fd)
        return None
    return pid1_fd


def _collect(proc: subprocess.Popen, budget_s: float, cap: int) -> tuple[bytes, bytes, str]:
    """Read the harness's stdout and stderr until EOF, the wall-clock budget or the byte cap."""
    deadline = time.monotonic() + budget_s
    out, err = bytearray(), bytearray()
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)  # type: ignore[arg-type]
        sel.register(proc.stderr, selectors.EVENT_READ, err)  # type: ignore[arg-type]
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return bytes(out), bytes(err), "timeout"
            for key, _ in sel.select(remaining):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                key.data.extend(chunk)
                if len(out) + len(err) > cap:
                    return bytes(out), bytes(err), "output_limit"
    return bytes(out), bytes(err), "exited"


def parse_records(out: bytes, err: bytes, ended: str, exit_status: int | None) -> SandboxRun:
    """The runner's records of one run, from a channel only the runner can write to (see harness.py)."""
    run = SandboxRun(ended=ended, exit_status=exit_status, stderr=err[-4096:].decode("utf-8", "replace"))
    for line in out.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if record.get("event") == "ready":
            run.ready = True
        elif record.get("event") == "syntax_error":
            run.syntax_error = str(record.get("detail", ""))
        elif isinstance(record.get("i"), int) and record["i"] not in run.records:
            run.records[record["i"]] = record
    return run

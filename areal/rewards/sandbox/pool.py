"""A pool of long-lived sandbox workers: one bubblewrap each, a fresh jail per program.

Starting bubblewrap and an interpreter per program costs ~90 ms on the 2-core machine; a worker
pays that once and then ~5 ms per program for fresh namespaces (`sandbox_server.py`). Workers
start on first use, never when a recipe is loaded, and are lent to one thread at a time. A
worker that dies, sends garbage or stays silent past its job's budget plus GRACE_S is killed
with its whole namespace, its program is reported as 'killed', 'sandbox_error' or 'timeout'
(never a silent 0), and the next program gets a fresh worker. Silence past a job's deadline is
the program's 'timeout', a 0, not a dropped sample: the pool cannot tell a worker its program
starved from a broken one, and a policy must not learn that a slow enough program is dropped.
With `reuse=False` each worker runs one program and is killed (the one-sandbox-per-program
path): the same jail, without the reuse.
This module only runs and collects; it trusts nothing the worker sends beyond the framing, and
scoring stays in `code_reward.py`.
"""

from __future__ import annotations

import json
import os
import queue
import selectors
import struct
import time
import weakref

from areal.rewards.sandbox.cgroup import RECLAIM_ABOVE_BYTES, WorkerCgroup
from areal.rewards.sandbox.launch import CGROUP_CPU_IN_JAIL, JAIL_MODULES, boot_source
from areal.rewards.sandbox.layers import SandboxLayers, SandboxRun
from areal.rewards.sandbox.limits import Limits
from areal.rewards.sandbox.process import (
    STARTUP_SLACK_S,
    SandboxProcess,
    job_payload,
    output_cap,
    parse_records,
    tests_budget_s,
)

# `python -I -c BOOT`: load the jail's modules from source, then serve jobs until stdin closes
BOOT_SOURCE = boot_source((*JAIL_MODULES, "sandbox_server"), "sandbox_server.serve")
HEADER = struct.Struct(">I")
JOB_SLACK_S = 1.0  # namespaces, mounts and compiling the program, on a loaded machine
GRACE_S = 5.0  # past the job's own budget, a silent worker is broken
STDERR_TAIL_BYTES = 4096
ENDINGS = ("exited", "timeout", "output_limit")


class WorkerFailure(Exception):
    """The worker, not the program, failed; `reason` is the CodeResult reason to report."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


class SandboxWorker:
    """One started bubblewrap running the server. Not thread-safe: the pool lends it out."""

    def __init__(self, layers: SandboxLayers, limits: Limits, source: str, reuse: bool = True) -> None:
        self.cgroup, self.kernel_floor = None, 0
        try:
            if layers.cgroup is not None:
                self.cgroup = WorkerCgroup(layers.cgroup, limits.memory_mb, limits.max_processes)
            cgroup_cpu = None if self.cgroup is None else self.cgroup.cpu_usage_file
            self.sandbox = SandboxProcess(layers, limits, source, cgroup_cpu)
        except OSError as exc:
            if self.cgroup is not None:
                self.cgroup.remove()
            raise WorkerFailure("sandbox_error", f"sandbox worker failed to start: {exc}") from exc
        self.pid = self.sandbox.proc.pid
        self._stderr = bytearray()
        try:
            settings = _encode({"tmpfs_bytes": limits.tmpfs_bytes, "tmpfs_files": limits.tmpfs_files, "reuse": reuse})
            hello = self._exchange(settings, time.monotonic() + STARTUP_SLACK_S, STDERR_TAIL_BYTES, "sandbox_error")
            if hello != {"event": "hello"}:
                raise WorkerFailure("sandbox_error", f"it sent {hello!r:.80}")
            if self.cgroup is not None:
                # after the hello, before any job: nothing a program starts is outside it
                self.cgroup.adopt(self.pid)
                self.kernel_floor = self.cgroup.kernel_bytes()
        except (WorkerFailure, OSError) as failure:
            self.kill()
            why = failure.detail if isinstance(failure, WorkerFailure) else str(failure)
            raise WorkerFailure("sandbox_error", f"sandbox worker did not start: {why}") from None

    def run(self, payload: dict, budget_s: float, cap: int) -> dict:
        """Send one job and wait for its reply, at most `budget_s` + GRACE_S; silence is the program's timeout."""
        return self._exchange(_encode(payload), time.monotonic() + budget_s + GRACE_S, cap, "timeout")

    def oom_kills(self) -> int:
        """Processes the kernel killed in the worker's cgroup for want of memory (0 without a cgroup)."""
        return 0 if self.cgroup is None else self.cgroup.oom_kills()

    def settle(self) -> None:
        """After a job: reclaim the kernel memory it left charged to the worker's cgroup (the negative
        dentries of its lookups), once that passes RECLAIM_ABOVE_BYTES over what the worker started with."""
        if self.cgroup is not None and self.cgroup.kernel_bytes() - self.kernel_floor > RECLAIM_ABOVE_BYTES:
            self.cgroup.reclaim()
            self.kernel_floor = max(self.kernel_floor, self.cgroup.kernel_bytes())

    def kill(self) -> None:
        self.sandbox.kill()
        if self.cgroup is not None:
            self.settle()  # what it leaves would be charged to the host once the cgroup goes
            self.cgroup.remove()

    def _exchange(self, request: bytes, deadline: float, cap: int, late: str) -> dict:
        """Write `request` while reading one reply frame (and the stderr tail) until `deadline`,
        past which the failure's reason is `late`."""
        proc = self.sandbox.proc
        reply = bytearray()
        with selectors.DefaultSelector() as sel:
            if request:
                sel.register(proc.stdin, selectors.EVENT_WRITE)  # type: ignore[arg-type]
            sel.register(proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
            sel.register(proc.stderr, selectors.EVENT_READ)  # type: ignore[arg-type]
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WorkerFailure(late, f"sandbox worker gave no answer in time{self._why()}")
                for key, _ in sel.select(remaining):
                    if key.fileobj is proc.stdin:
                        try:
                            request = request[os.write(key.fd, request[: 1 << 16]) :]
                        except BrokenPipeError:
                            raise WorkerFailure("killed", f"sandbox worker died{self._why()}") from None
                        if not request:
                            sel.unregister(proc.stdin)  # type: ignore[arg-type]
                        continue
                    chunk = os.read(key.fd, 1 << 16)
                    if key.fileobj is proc.stderr:
                        self._stderr = (self._stderr + chunk)[-STDERR_TAIL_BYTES:]
                        if not chunk:
                            sel.unregister(proc.stderr)  # type: ignore[arg-type]
                        continue
                    if not chunk:
                        raise WorkerFailure("killed", f"sandbox worker died{self._why()}")
                    reply += chunk
                    if message := _frame(reply, cap):
                        return message

    def _why(self) -> str:
        lines = self._stderr.decode("utf-8", "replace").strip().splitlines()
        return f": {lines[-1]}" if lines else ""


def _encode(message: dict) -> bytes:
    body = json.dumps(message).encode()
    return HEADER.pack(len(body)) + body


def _frame(data: bytearray, cap: int) -> dict | None:
    """The one complete frame in `data`, None while it is still arriving."""
    if len(data) < HEADER.size:
        return None
    (size,) = HEADER.unpack_from(data)
    if size > cap:
        raise WorkerFailure("sandbox_error", f"sandbox worker sent a {size}-byte frame, over the {cap}-byte cap")
    if len(data) < HEADER.size + size:
        return None
    if len(data) > HEADER.size + size:
        raise WorkerFailure("sandbox_error", "sandbox worker sent bytes after its reply")
    try:
        message = json.loads(bytes(data[HEADER.size :]))
    except (ValueError, RecursionError):
        message = None
    if not isinstance(message, dict):
        raise WorkerFailure("sandbox_error", f"sandbox worker sent garbage: {bytes(data[:40])!r}")
    return message


class SandboxPool:
    """Up to `size` workers, started lazily, one program at a time each; thread-safe `run`."""

    def __init__(self, layers: SandboxLayers, limits: Limits, size: int, reuse: bool = True) -> None:
        self.layers, self.limits, self.reuse = layers, limits, reuse
        self._idle: queue.SimpleQueue[SandboxWorker | None] = queue.SimpleQueue()
        for _ in range(size):
            self._idle.put(None)  # a slot whose worker starts on first use
        self._live: set[SandboxWorker] = set()
        self._closer = weakref.finalize(self, _kill_all, self._live)  # also runs at exit

    def run(self, job: dict) -> SandboxRun:
        """Run one program's tests in a fresh jail on an idle worker; records unverified."""
        if not self._closer.alive:
            raise RuntimeError("code sandbox pool is closed; create a new CodeTests")
        n_tests = len(job["inputs"])
        budget_s = JOB_SLACK_S + tests_budget_s(self.limits, n_tests)
        cap = output_cap(self.limits, n_tests)
        payload = {**job_payload(job, self.limits, self.layers), "budget_s": budget_s, "max_reply_bytes": cap}
        worker = self._idle.get()
        try:
            if worker is None:
                worker = SandboxWorker(self.layers, self.limits, BOOT_SOURCE, self.reuse)
                self._live.add(worker)
            payload["cgroup_cpu"] = None if worker.cgroup is None else CGROUP_CPU_IN_JAIL
            oom_kills = worker.oom_kills()
            run = _run_from_reply(worker.run(payload, budget_s, _reply_cap(cap)))
            run.oom_killed = worker.oom_kills() > oom_kills
            if self.reuse:
                worker.settle()  # a worker used once settles as it is killed
            return run
        except WorkerFailure as failure:
            self._retire(worker)
            worker = None
            return SandboxRun(broken=(failure.reason, failure.detail))
        finally:
            if not self.reuse:
                self._retire(worker)
                worker = None
            self._idle.put(worker)

    def _retire(self, worker: SandboxWorker | None) -> None:
        if worker is not None:
            self._live.discard(worker)
            worker.kill()

    def pids(self) -> set[int]:
        """Host pids of the live workers' bubblewraps (for tests and diagnostics)."""
        return {worker.pid for worker in list(self._live)}

    def close(self) -> None:
        self._closer()


def _reply_cap(records_cap: int) -> int:
    # JSON may escape each character of the records and the stderr tail as \uXXXX (6 bytes);
    # the server stops reading at most one 64 KiB chunk past the cap
    return 6 * (records_cap + (1 << 16) + STDERR_TAIL_BYTES) + 4096


def _run_from_reply(reply: dict) -> SandboxRun:
    if reply.get("event") == "error":
        return SandboxRun(broken=("sandbox_error", f"sandbox worker: {reply.get('detail', '')}"[:500]))
    out, err, ended, status = (reply.get(k) for k in ("out", "err", "ended", "exit_status"))
    if (
        reply.get("event") != "done"
        or not isinstance(out, str)
        or not isinstance(err, str)
        or ended not in ENDINGS
        or not isinstance(status, int)
    ):
        raise WorkerFailure("sandbox_error", f"sandbox worker sent a malformed reply: {reply!r:.80}")
    return parse_records(out.encode(), err.encode(), ended, status)


def _kill_all(workers: set[SandboxWorker]) -> None:
    while workers:
        workers.pop().kill()

"""The test runner that executes inside the sandbox, next to the untrusted program.

The one idea: this side only *runs* the program and reports what it produced; it never sees the
expected outputs, so nothing the program does here (exit early, patch `print`, patch this module,
kill this process) can turn a failure into a pass. The trusted parent compares. Each test runs in
a forked child with its own process group and rlimits; the harness enforces the per-test wall
clock and the output cap and reports one JSON line per test, tagged with the run's nonce.

The program shares this process's uid, so it may ptrace or signal the harness: that can only
lose results (counted as failures) or send garbage (capped, nonce-checked, compared by the
parent), never produce a pass it did not compute.

Stdlib only, and self-contained: the parent passes this file's source to `python -I -c` (one
program per process), or the pooled worker (`sandbox_server.py`) calls `run_job` once per job.
It does not isolate anything by itself (bubblewrap, the per-job namespaces and the uid do that).
"""

from __future__ import annotations

import builtins
import json
import os
import resource
import select
import signal
import sys
import time
import traceback

EXIT_CRASH = 1
EXIT_MEMORY = 3
EXIT_BAD_RESULT = 4
STDERR_TAIL_BYTES = 4096


def main() -> None:
    """One-shot entry: read one job from stdin, report on stdout, exit."""
    job = json.loads(sys.stdin.buffer.read())
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    channel = os.dup(1)
    os.dup2(null, 1)
    run_job(job, channel, close_in_child=(channel, null))


def run_job(job: dict, channel: int, close_in_child: tuple[int, ...]) -> None:
    """Compile the program, run each test in a forked child, write one record per test to `channel`."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    def emit(record: dict) -> None:
        record["nonce"] = job["nonce"]
        data = (json.dumps(record) + "\n").encode()
        while data:
            data = data[os.write(channel, data) :]

    try:
        code = compile(job["code"], "<program>", "exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        emit({"event": "syntax_error", "detail": _exception_line(exc)})
        return
    emit({"event": "ready"})
    for i, test_input in enumerate(job["inputs"]):
        record = _run_test(code, test_input, job, close_in_child)
        record["i"] = i
        emit(record)


def _exception_line(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):
        return f"{type(exc).__name__}: {exc.msg} (line {exc.lineno})"
    return "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]


def _run_test(code, test_input, job: dict, close_in_child: tuple[int, ...]) -> dict:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    res_r, res_w = os.pipe()
    if job["kind"] == "stdio":
        stdin_fd = os.memfd_create("stdin")
        os.write(stdin_fd, str(test_input).encode())
        os.lseek(stdin_fd, 0, os.SEEK_SET)
    else:
        stdin_fd = os.open("/dev/null", os.O_RDONLY)
    pid = os.fork()
    if pid == 0:
        try:
            for fd in (*close_in_child, out_r, err_r, res_r):
                os.close(fd)
            _child(code, test_input, job, stdin_fd, out_w, err_w, res_w)
        finally:
            os._exit(EXIT_CRASH)
    for fd in (out_w, err_w, res_w, stdin_fd):
        os.close(fd)
    return _watch(pid, out_r, err_r, res_r, job)


def _child(code, test_input, job: dict, stdin_fd: int, out_w: int, err_w: int, res_w: int) -> None:
    """Run the program once; never returns. Exit codes tell the harness how it ended."""
    os.setpgid(0, 0)
    os.dup2(stdin_fd, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    for fd in (stdin_fd, out_w, err_w):
        os.close(fd)
    cpu_s = int(job["timeout_s"]) + 1
    memory = job["memory_mb"] * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (job["max_file_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (job["max_processes"],) * 2)
    sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)
    if job["guard_socket"]:
        sys.addaudithook(_refuse_sockets)
    # bind what we need before the program can patch it
    dumps, write, exit_now, stdout = json.dumps, os.write, os._exit, sys.stdout
    is_call = job["kind"] == "call"
    namespace = {"__name__": "solution" if is_call else "__main__", "__builtins__": builtins}
    status = 0
    try:
        exec(code, namespace)
        if is_call:
            value = _function(namespace, job["fn_name"])(*test_input)
            try:
                payload = dumps(value).encode()
            except (TypeError, ValueError) as exc:
                sys.stderr.write(f"result is not JSON-serialisable: {exc}\n")
                status = EXIT_BAD_RESULT
            else:
                while payload:
                    payload = payload[write(res_w, payload) :]
    except SystemExit as exc:
        if is_call or exc.code not in (None, 0):
            sys.stderr.write(f"SystemExit: {exc.code}\n")
            status = EXIT_CRASH
    except MemoryError:
        status = EXIT_MEMORY
    except BaseException:
        traceback.print_exc()
        status = EXIT_CRASH
    try:
        stdout.flush()
        sys.stderr.flush()
    finally:
        exit_now(status)


def _function(namespace: dict, fn_name: str):
    if callable(namespace.get(fn_name)):
        return namespace[fn_name]
    if isinstance(namespace.get("Solution"), type):
        return getattr(namespace["Solution"](), fn_name)
    raise NameError(f"the program defines no function {fn_name!r} (nor Solution.{fn_name})")


def _refuse_sockets(event: str, args: tuple) -> None:
    if event.startswith("socket."):
        raise PermissionError("network access is not allowed in the sandbox")


def _watch(pid: int, out_r: int, err_r: int, res_r: int, job: dict) -> dict:
    """Wait for the test child under the wall clock and the output cap; report how it ended."""
    cap = job["max_output_bytes"]
    pidfd = os.pidfd_open(pid)
    bufs = {out_r: bytearray(), err_r: bytearray(), res_r: bytearray()}
    poller = select.poll()
    for fd in (*bufs, pidfd):
        poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + job["timeout_s"]
    verdict = None
    while verdict is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            verdict = "timeout"
            break
        for fd, _ in poller.poll(remaining * 1000):
            if fd == pidfd:
                verdict = "exited"
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                poller.unregister(fd)
                continue
            bufs[fd] += chunk
            if fd == err_r:
                del bufs[fd][:-STDERR_TAIL_BYTES]
            elif len(bufs[fd]) > cap:
                verdict = "output_limit"
    _kill_group(pid)
    _, wait_status = os.waitpid(pid, 0)
    for fd in bufs:
        _drain(fd, bufs[fd], cap)
    for fd in (*bufs, pidfd):
        os.close(fd)
    if any(len(bufs[fd]) > cap for fd in (out_r, res_r)):
        verdict = "output_limit"
    stderr = bufs[err_r].decode("utf-8", "replace")
    out = (bufs[res_r] if job["kind"] == "call" else bufs[out_r]).decode("utf-8", "replace")
    if verdict == "timeout":
        return {"status": verdict, "detail": f"still running after {job['timeout_s']} s"}
    if verdict == "output_limit":
        return {"status": verdict, "detail": f"more than {cap} bytes of output"}
    return _classify(wait_status, out, stderr, job["kind"])


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
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

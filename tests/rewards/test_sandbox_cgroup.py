"""Each worker in a cgroup of its own where the machine allows one, and where it allows one.

Where a real place exists here (cgroup v1 as root on this machine, a delegated v2 subtree on a
systemd desktop), a worker's processes are checked to be in their cgroup under the job's
limits. Finding a v2 place is checked on a stand-in cgroup tree in tmp_path: the kernel's v2
controllers are bound to v1 on this machine, so only the logic can be exercised here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from areal.rewards import CodeTests, detect_layers
from areal.rewards.code_reward import _verdicts
from areal.rewards.sandbox import cgroup as sandbox_cgroup
from areal.rewards.sandbox.cgroup import WORKER_OVERHEAD_MB, WORKER_PROCESSES, CgroupPlace, WorkerCgroup
from areal.rewards.sandbox.layers import SandboxRun
from areal.rewards.sandbox.limits import Limits
from tests.rewards.conftest import run_one, worker_pids

ONE = {"kind": "stdio", "inputs": [""], "outputs": ["1"]}
@pytest.fixture
def cgroup_layers():
    layers = detect_layers()
    if layers.missing or layers.cgroup is None:
        pytest.skip(f"no worker cgroups here: {layers.cgroup_problem or layers.describe()}")
    return layers


def tree(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        found.add(current)
        for task in Path(f"/proc/{current}/task").iterdir():
            todo += [int(c) for c in (task / "children").read_text().split()]
    return found


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_every_process_of_a_worker_is_in_its_cgroup_under_the_jobs_limits(cgroup_layers):
    with CodeTests(timeout_s=1.0, memory_mb=256, workers=1) as scorer:
        assert run_one(scorer, "print(1)", ONE).reward == 1.0
        (worker,) = scorer._pool._live
        dirs = worker.cgroup.dirs
        # the tree first: a process that exits before the members are read is no longer running
        # after, and one forked meanwhile (the next job's jail) is not in the tree
        processes = tree(worker.pid)
        members = {int(pid) for pid in (dirs["memory"] / "cgroup.procs").read_text().split()}
        assert {pid for pid in processes if running(pid)} <= members and worker.pid in worker_pids(scorer)
        if cgroup_layers.cgroup.version == 2:
            limits = [("memory", "memory.max"), ("cpu", "cpu.max"), ("pids", "pids.max")]
        else:
            limits = [("memory", "memory.limit_in_bytes"), ("cpu", "cpu.cfs_quota_us"), ("pids", "pids.max")]
        assert [(dirs[c] / f).read_text().strip() for c, f in limits] == [
            str((256 + WORKER_OVERHEAD_MB) << 20),
            "100000 100000" if cgroup_layers.cgroup.version == 2 else "100000",  # one CPU
            str(Limits().max_processes + WORKER_PROCESSES),
        ]
    assert [d for d in dirs.values() if d.exists()] == []


@pytest.fixture
def fake_v2(tmp_path, monkeypatch):
    """A cgroup v2 tree in tmp_path where this process sits alone in /app/run.scope."""
    root = tmp_path / "cgroup"
    scope = root / "app" / "run.scope"
    scope.mkdir(parents=True)
    (scope / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (scope / "cgroup.subtree_control").write_text("")
    (scope / "cgroup.procs").write_text(f"{os.getpid()}\n")
    monkeypatch.setattr(sandbox_cgroup, "_mounts", lambda: [(str(root), "cgroup2", "rw")])
    monkeypatch.setattr(sandbox_cgroup, "_own_cgroups", lambda: {"": "/app/run.scope"})
    return scope


def test_a_v2_cgroup_holding_only_us_delegates_after_we_move_into_a_leaf(fake_v2):
    place = sandbox_cgroup.find_place()
    assert place == CgroupPlace(2, dict.fromkeys(("memory", "cpu", "pids"), fake_v2))
    (leaf,) = fake_v2.glob(f"areal-host-{os.getpid()}-*")
    assert (leaf / "cgroup.procs").read_text() == str(os.getpid())
    assert (fake_v2 / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"


def test_a_v2_cgroup_shared_with_other_processes_is_left_alone(fake_v2):
    (fake_v2 / "cgroup.procs").write_text(f"{os.getpid()}\n1\n")
    reason = sandbox_cgroup.find_place()  # as root, followed by why cgroup v1 is not used either
    assert reason.startswith("cgroup v2 /app/run.scope holds 1 other process(es), so it cannot delegate controllers "
                             "(start areal in a cgroup of its own)")
    assert (fake_v2 / "cgroup.subtree_control").read_text() == ""


def test_a_process_in_an_areal_leaf_makes_its_workers_beside_it(fake_v2, monkeypatch):
    (fake_v2 / "cgroup.subtree_control").write_text("cpu memory pids\n")
    (fake_v2 / "areal-host-1").mkdir()
    monkeypatch.setattr(sandbox_cgroup, "_own_cgroups", lambda: {"": "/app/run.scope/areal-host-1"})
    place = sandbox_cgroup.find_place()
    assert place == CgroupPlace(2, dict.fromkeys(("memory", "cpu", "pids"), fake_v2))
    worker = WorkerCgroup(place, memory_mb=256, max_processes=16)
    (directory,) = set(worker.dirs.values())
    written = {f.name: f.read_text() for f in directory.iterdir()}
    assert written == {"memory.max": str((256 + WORKER_OVERHEAD_MB) << 20), "memory.swap.max": "0",
                       "cpu.max": "100000 100000", "pids.max": "24"}


def test_a_process_the_cgroup_killed_is_a_memory_failure_of_the_program():
    run = SandboxRun(ready=True, records={0: {"status": "killed", "detail": "killed by Killed"}}, oom_killed=True)
    out_of_memory = ("memory", "killed by the kernel: the job's cgroup ran out of memory")
    assert _verdicts(run, "call", [3, 4]) == [out_of_memory] * 2


TWIN = """
import importlib.util, os, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("sandbox_cgroup", sys.argv[1])
sandbox_cgroup = sys.modules["sandbox_cgroup"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sandbox_cgroup)
place = sandbox_cgroup.CgroupPlace(2, dict.fromkeys(sandbox_cgroup.CONTROLLERS, Path(sys.argv[2])))
worker = sandbox_cgroup.WorkerCgroup(place, memory_mb=256, max_processes=16)
print(os.getpid(), worker.dirs["memory"].name)
"""


def test_two_areal_processes_that_are_each_pid_1_of_their_namespace_get_distinct_cgroups(tmp_path):
    """Two containers sharing a parent cgroup: each areal is PID 1, so a name from the pid alone collides."""
    if shutil.which("unshare") is None:
        pytest.skip("util-linux's unshare is not installed")
    argv = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--", sys.executable, "-I", "-c", TWIN,
            sandbox_cgroup.__file__, str(tmp_path)]
    twins = [subprocess.run(argv, capture_output=True, text=True, timeout=60) for _ in range(2)]
    if any("unshare failed" in twin.stderr or "unshare:" in twin.stderr for twin in twins):
        pytest.skip(f"no unprivileged PID namespaces here: {twins[0].stderr.strip()}")
    assert [twin.returncode for twin in twins] == [0, 0], [twin.stderr[-500:] for twin in twins]
    (pid_a, name_a), (pid_b, name_b) = (twin.stdout.split() for twin in twins)
    assert (pid_a, pid_b) == ("1", "1")
    assert name_a != name_b and {name_a, name_b} <= {d.name for d in tmp_path.iterdir()}

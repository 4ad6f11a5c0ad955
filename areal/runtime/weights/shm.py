"""transport.weights=shm: the trainer writes each version once into a POSIX shared-memory segment and every
follower on the machine maps it, so the weights never cross the filesystem and are copied only into the
follower's model.

A segment is `[u64 index length][msgpack index][tensor bytes, each at a 64-byte boundary]`; the index lists
each tensor's name, dtype, shape and offset, and a follower reads the tensors in place (`torch.frombuffer`).
The trainer keeps the newest `keep` versions (lagged mode's older ones included) and unlinks the rest; it
unlinks its own when it stops. A trainer that is killed cannot, so it tells a small watcher, in a session of
its own, each segment it makes and unlinks: when the trainer is gone the watcher's pipe closes and it unlinks
whatever is left. Every name starts with the run's prefix (`segment_prefix`) and holds the trainer's pid,
so a restarted trainer's segments are never the dead one's. Segments live on one machine: a follower on
another host is told no segment by that name exists. A slow follower told of a version the trainer has since
unlinked (it published `keep` newer ones) keeps what it holds: the newest's update follows. It tells that case
from a missing segment by the newer segments of the same trainer listed in /dev/shm (Linux); where shared memory
is not listed (macOS), a gone segment stays an error. The checkpoint gets the policy as a file, written by the
trainer (no published file exists to copy).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import struct
import subprocess
import sys
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path

import msgpack  # type: ignore[import-untyped]
import torch
from torch import Tensor

from areal.errors import RunError
from areal.graph.roles import Follower
from areal.runtime.storage.checkpoint import policy_name
from areal.runtime.weights.transport import Source, Transport
from areal.runtime.wire.weight_update import Via

KIND = "shm"
ALIGN = 64  # each tensor starts at a multiple of this, so every dtype can be read in place
LENGTH = struct.Struct("<Q")  # the index's length, first in the segment
LISTED = Path("/dev/shm")  # where Linux lists POSIX shared memory; absent elsewhere
VERSION_MARK = "_v"  # a segment's name ends with it and its version
logger = logging.getLogger(__name__)

# unlinks, at end of input, every segment it was told of ("+NAME") and not told is gone ("-NAME")
WATCHER = """
import sys
from multiprocessing.shared_memory import SharedMemory
live = set()
for line in sys.stdin:
    (live.add if line[0] == "+" else live.discard)(line[1:].strip())
for name in live:
    try:
        SharedMemory(name).unlink()
    except FileNotFoundError:
        pass
"""


def segment_prefix(run_dir: Path | str) -> str:
    """What every segment of the run at `run_dir` is named from (`/dev/shm/PREFIX...` on Linux)."""
    return "areal_" + hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:12]


class ShmPublisher:
    def __init__(self, source: Source) -> None:
        self.source = source
        self.segments: dict[int, str] = {}  # version -> its segment's name, the newest `keep`
        self.watcher: subprocess.Popen[str] | None = None
        if not source.rank_follower:
            self.watcher = subprocess.Popen([sys.executable, "-c", WATCHER], stdin=subprocess.PIPE, text=True,
                                            start_new_session=True)  # outside the worker's group: it outlives it

    def publish(self, version: int) -> Via | None:
        weights = self.source.gather()  # every rank: gathering is a collective
        if self.source.rank_follower:
            return None
        name = f"{segment_prefix(self.source.plan.run_dir)}_{self.source.model}_{os.getpid()}{VERSION_MARK}{version}"
        self._tell(f"+{name}", flush=True)  # before it exists: a kill between the two leaves nothing the watcher misses
        try:
            write(name, weights)
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
            self._unlink(name)
            raise RunError(no_room(version, weights, self.source.keep)) from None
        self.segments[version] = name
        for old in [v for v in self.segments if not version - self.source.keep < v <= version]:
            self._unlink(self.segments.pop(old))
        return Via(KIND, name, weights=self.source.weights)

    def reported(self) -> None:
        pass

    def sent_bytes(self) -> None:
        return None

    def checkpoint(self, folder: Path) -> None:
        self.source.save(None if self.source.rank_follower else str(folder / policy_name(self.source.model)))

    def close(self) -> None:
        for name in self.segments.values():
            self._unlink(name)
        self.segments.clear()
        if self.watcher is not None:
            assert self.watcher.stdin is not None
            self.watcher.stdin.close()
            self.watcher.wait()

    def _unlink(self, name: str) -> None:
        _unlink(name)
        self._tell(f"-{name}")

    def _tell(self, line: str, flush: bool = False) -> None:
        """A gone segment need not reach the watcher at once (unlinking it again finds nothing); a new one must."""
        assert self.watcher is not None and self.watcher.stdin is not None
        self.watcher.stdin.write(line + "\n")
        if flush:
            self.watcher.stdin.flush()


def no_room(version: int, weights: dict[str, Tensor], keep: int) -> str:
    """Why a version's segment did not fit in shared memory, and the ways on (a container's /dev/shm is 64 MB)."""
    size = sum(t.numel() * t.element_size() for t in weights.values()) / 2**20
    where = f"{LISTED} ({_mb(LISTED)})" if LISTED.is_dir() else "shared memory"
    return (f"transport.weights=shm: no room in {where} for version {version}'s weights ({size:.1f} MB; the newest "
            f"{keep} versions are kept there): give it more (docker run --shm-size=...), or use "
            "transport.weights=files")


def _mb(folder: Path) -> str:
    stats = os.statvfs(folder)
    return f"{stats.f_blocks * stats.f_frsize / 2**20:.0f} MB, {stats.f_bavail * stats.f_frsize / 2**20:.1f} MB free"


def write(name: str, weights: dict[str, Tensor]) -> None:
    """A segment named `name` holding `weights` (from any device), closed in this process once written."""
    index: list[tuple[str, str, list[int], int, int]] = []  # name, dtype, shape, offset, bytes
    offset = 0
    for key, t in weights.items():
        nbytes = t.numel() * t.element_size()
        index.append((key, str(t.dtype).removeprefix("torch."), list(t.shape), offset, nbytes))
        offset += _aligned(nbytes)
    header = msgpack.packb(index)
    start = _aligned(LENGTH.size + len(header))
    segment = SharedMemory(name, create=True, size=max(start + offset, 1))
    try:
        # written through the descriptor, not the mapping: the kernel fills fresh pages about twice as fast
        # as first touches through a mapping fault them in one by one (measured on this VM)
        fd = segment._fd  # type: ignore[attr-defined]
        os.pwrite(fd, LENGTH.pack(len(header)) + header, 0)
        for (_, _, _, at, nbytes), t in zip(index, weights.values()):
            if nbytes:
                flat = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
                os.pwrite(fd, memoryview(flat.numpy()), start + at)  # type: ignore[arg-type]
    finally:
        segment.close()


def receive(via: Via, follower: Follower, version: int) -> bool:
    """Map the segment, hand the node the tensors in place (it copies them into its model), unmap. False if it is
    gone because its trainer published `keep` newer versions meanwhile (the newest's update follows)."""
    try:
        segment = _attach(via.where)
    except RunError:
        newer = newer_versions(via.where)
        if not newer:
            raise
        logger.info("weights v%d were superseded by v%d before they could be mapped; waiting for its update",
                    version, max(newer))
        return False
    try:
        follower.load_weights(read(segment), version)
        return True
    finally:
        try:
            segment.close()
        except BufferError:
            pass  # the node kept a tensor of the segment: it stays mapped until the node lets go of it


def read(segment: SharedMemory) -> dict[str, Tensor]:
    """The tensors a segment holds, as views of it; a malformed index is a RunError naming the segment."""
    buf = segment.buf
    assert buf is not None  # an open segment is mapped
    try:
        (length,) = LENGTH.unpack_from(buf, 0)
        index = msgpack.unpackb(bytes(buf[LENGTH.size:LENGTH.size + length]))
        start = _aligned(LENGTH.size + length)
        weights = {}
        for key, dtype_name, shape, at, nbytes in index:
            dtype = getattr(torch, dtype_name)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"{key}: {dtype_name} is no dtype")
            flat = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=start + at) if nbytes \
                else torch.empty(0, dtype=torch.uint8)
            weights[key] = flat.view(dtype).view(shape)
        return weights
    except (ValueError, TypeError, AttributeError, RuntimeError, struct.error, msgpack.UnpackException) as err:
        raise RunError(f"shared-memory weights {segment.name}: malformed ({err})") from err


def newer_versions(name: str) -> list[int]:
    """The versions above `name`'s that its trainer holds in listed shared memory; none where nothing is listed."""
    base, _, version = name.rpartition(VERSION_MARK)
    if not LISTED.is_dir():
        return []
    listed = (p.name.removeprefix(base + VERSION_MARK) for p in LISTED.glob(f"{base}{VERSION_MARK}*"))
    return sorted(int(v) for v in listed if v.isdigit() and int(v) > int(version))


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _attach(name: str) -> SharedMemory:
    try:
        segment = SharedMemory(name)
    except FileNotFoundError:
        raise RunError(f"shared-memory weights {name}: no such segment on this machine (transport.weights=shm "
                       "needs the trainer and its followers on one host; or the trainer dropped it already)") from None
    # an attached segment is registered with this process's resource tracker, which would unlink it when the
    # follower exits: it is the trainer's to unlink
    resource_tracker.unregister(segment._name, "shared_memory")  # type: ignore[attr-defined]
    return segment


def _unlink(name: str) -> None:
    try:
        segment = SharedMemory(name)
    except FileNotFoundError:
        return
    segment.close()
    segment.unlink()


TRANSPORT = Transport(publisher=ShmPublisher, receive=receive, one_host=True)

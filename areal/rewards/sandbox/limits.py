"""The limits one test of an untrusted program runs under: what the harness applies to each forked test,
the meter sums over its processes, and the jail sizes its tmpfs by."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """Per-test resource limits, applied by the harness to each forked test and its processes."""

    timeout_s: float = 2.0  # CPU seconds of all its processes, and wall time not spent queued for a CPU
    memory_mb: int = 512  # its processes together, with the files on its tmpfs; each process too
    max_output_bytes: int = 1 << 20
    max_file_bytes: int = 16 << 20
    max_processes: int = 16  # threads count too; the runner is one of them
    max_open_files: int = 256  # per process
    tmpfs_bytes: int = 64 << 20  # each of /tmp and /dev/shm
    tmpfs_files: int = 4096  # each of /tmp and /dev/shm

    @property
    def backstop_s(self) -> float:
        """Wall clock after which a test ends however starved it was: a machine this loaded is broken."""
        return 3 * self.timeout_s + 1.0

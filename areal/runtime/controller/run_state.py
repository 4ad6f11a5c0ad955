"""What the controller knows of each worker process and of the run as a whole: the state its event loop,
its report and recovery handlers, the progress view and the summary all read."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal.runtime.controller.launchers import WorkerHandle


@dataclass
class WorkerProcess:
    """One started worker, as the controller tracks it: its handle, log, liveness and what it holds."""

    worker_id: str
    pool: str
    replica: int
    process: WorkerHandle  # a local child process or a Ray actor (areal.runtime.controller.placement)
    log_path: Path
    ready: bool = False
    last_seen: float = field(default_factory=time.monotonic)
    busy: float = 0.0
    cpu_s: float = 0.0  # its process tree's CPU seconds at its last heartbeat
    cpu_s_before: float = 0.0  # what the processes this one replaced (restarts) had used
    counts: dict[str, int] = field(default_factory=dict)
    last_error: str | None = None
    fatal: bool = False  # its error is one a restart would repeat (a node that broke its contract)
    holding: set[int] = field(default_factory=set)  # groups a trainer has gathered, not yet trained
    started_at: float = field(default_factory=time.monotonic)
    noted_wait: float = 0.0  # when it last said what it waits for (not started yet: Ray has no room for it)
    replacement: bool = False  # started in place of a dead worker (its first start has the run's deadline)
    long_call: str = ""  # the node call its pulses say it has been in for long (chain.LongCalls); "" when none

    @property
    def cpu_total(self) -> float:
        """CPU seconds this worker's processes used, its restarts' predecessors included."""
        return self.cpu_s_before + self.cpu_s


@dataclass
class RunState:
    """What the progress view and the summary read."""

    version: int = 0  # the slowest trainer's
    steps: int = 0
    started_at: float = field(default_factory=time.monotonic)
    last_step: dict[str, Any] = field(default_factory=dict)  # the policy trainer's newest step record
    first_entropy: float | None = None  # the policy's entropy at this start's first step (the summary's "from")
    evals: list[dict[str, Any]] = field(default_factory=list)
    staleness: Counter[int] = field(default_factory=Counter)
    trained_tokens: int = 0
    masked_tokens: int = 0  # output tokens of trained samples the staleness policy masked (older than η)
    stale_tokens: int = 0  # output tokens the loss read that were older than η (the admission policy's)
    truncated_masked: int = 0  # trained samples cut at max_new_tokens, given loss mask 0 (trainer.truncated=mask)
    startup_s: float = 0.0
    long_calls: list[str] = field(default_factory=list)  # each long node call, as its worker first said it
    cpu_at_start: float = field(default_factory=time.process_time)  # the controller's CPU before the run began
    status: str = "starting"

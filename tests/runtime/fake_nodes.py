"""Small custom nodes shaped like RL, with no model, for the runtime's tests (fake_rl.py, branched_rl.py).

The fake generate node emits one token per step per queued group, stamping each with the policy
version it holds, and picks up new versions between steps like the real engine. The fake trainer
appends what it trains (sample ids, the version it trains at, each sample's oldest token version,
its advantages) to `trained.jsonl` in the run directory, so tests assert on recorded versions and
values, not timings. Knobs come from environment variables so one file serves every test.
"""

import contextlib
import ctypes
import gc
import json
import os
import select
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from areal import Batch, Float, Int, Int32, Json, Ragged, node
from areal.graph.roles import DROPPED

HOLD_TIMEOUT_S = 120.0


def knob(name: str, default: int) -> int:
    """A test's setting, read when the node is built: this module is imported once per process, while each
    test sets its own environment (the controller runs in the test's process)."""
    return int(os.environ.get(name, str(default)))


def compute(matmuls: int) -> None:
    """Fixed work standing for a decode or optimizer step (work, not a timed wait)."""
    x = torch.ones(128, 128)
    for _ in range(matmuls):
        x = torch.tanh(x @ x / 128)


def compute_for(seconds: float) -> None:
    """Work (not a timed wait) until `seconds` have passed: a step busy for as long as a test needs on any
    machine, where a fixed count of matmuls took 0.8 s on one and over 1 s on another."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        compute(50)


_IN_ATTRIB, _IN_CREATE, _IN_MOVED_TO = 0x4, 0x100, 0x80


def wait_for(path: Path, timeout_s: float = HOLD_TIMEOUT_S) -> None:
    """Block until the test creates `path` (an event the test controls), or fail after `timeout_s`: woken by
    inotify when an entry of its folder is made, moved in or touched."""
    libc = ctypes.CDLL(None, use_errno=True)
    watch = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if watch < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    deadline = time.monotonic() + timeout_s
    try:
        if libc.inotify_add_watch(watch, os.fsencode(path.parent), _IN_CREATE | _IN_MOVED_TO | _IN_ATTRIB) < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {path.parent}")
        while not path.exists():  # looked at after the watch is set: a file made before it is seen here
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([watch], [], [], remaining)[0]:
                raise TimeoutError(f"{path} never appeared")
            with contextlib.suppress(BlockingIOError):
                os.read(watch, 1 << 16)  # the events themselves do not matter: the loop looks again
    finally:
        os.close(watch)


@node(inputs={"reward": Float["S"], "group_id": Int["S"]}, outputs={}, role="filter")
def every_third_group(batch):
    return {DROPPED: {row: "a multiple of 3" for row, g in enumerate(batch["group_id"].tolist()) if g % 3 == 0}}


class Counting:
    """An endless, resumable prompt stream."""

    fields = ("prompt",)

    def __init__(self):
        self.i = 0
        self.huge_at = knob("FAKE_HUGE_PROMPT_AT", -1)  # a record too large for any frame
        self.unpackable_at = knob("FAKE_UNPACKABLE_AT", -1)  # a record msgpack cannot carry: an int past 64 bits

    def __iter__(self):
        while True:
            self.i += 1
            huge = self.i - 1 == self.huge_at
            yield {"prompt": 2**70 if self.i - 1 == self.unpackable_at else "x" * 200_000 if huge else f"p{self.i - 1}"}

    def state(self):
        return {"i": self.i}

    def restore(self, state):
        self.i = state["i"]


@node(
    inputs={"prompt": Json["S"]},
    outputs={"prompt_ids": Int["S", "T"], "output_ids": Int["S", "T"], "behav_logp": Float["S", "T"],
             "versions": Int32["S", "T"]},
    kind="generate",
)
class FakeGenerate:
    def setup(self, context):
        self.version = context.version
        self.queue = []
        self.tokens, self.work = knob("FAKE_TOKENS", 4), knob("FAKE_STEP_WORK", 0)  # a slow generator: work a step

    def submit(self, batch, meta):
        self.queue.append([batch, meta, []])

    def pending(self):
        return len(self.queue)

    def load_weights(self, weights, version):
        if int(weights["version"]) != version:  # FakeTrainer's weights are its version
            raise ValueError(f"sent the weights of version {int(weights['version'])} as version {version}")
        self.version = version

    def step(self):
        compute(self.work)
        done = []
        for item in self.queue:
            item[2].append(self.version)
            if len(item[2]) == self.tokens:
                done.append(item)
        self.queue = [item for item in self.queue if item not in done]
        return [self._expand(batch, meta, versions) for batch, meta, versions in done]

    def _expand(self, batch, meta, versions):
        k = meta.samples
        rows = [(i, j) for i in range(batch.size) for j in range(k)]
        group_ids = batch["group_id"]
        fields = {
            "prompt": [batch["prompt"][i] for i, _ in rows],
            "group_id": torch.tensor([int(group_ids[i]) for i, _ in rows]),
            "sample_id": torch.tensor([int(group_ids[i]) * k + j for i, j in rows]),
            "prompt_ids": Ragged.from_rows([torch.tensor([1, 2]) for _ in rows]),
            "output_ids": Ragged.from_rows([torch.arange(self.tokens) for _ in rows]),
            "behav_logp": Ragged.from_rows([torch.zeros(self.tokens) for _ in rows]),
            "versions": Ragged.from_rows([torch.tensor(versions, dtype=torch.int32) for _ in rows]),
        }
        return Batch(fields), meta


@node(
    inputs={"prompt_ids": Int["S", "T"], "output_ids": Int["S", "T"], "behav_logp": Float["S", "T"],
            "versions": Int32["S", "T"], "advantage": Float["S"]},
    outputs={},
    kind="ppo-update",
)
class FakeTrainer:
    def setup(self, context):
        self.version = context.version
        self.log = Path(context.run_dir) / "trained.jsonl"
        self.work_s = knob("FAKE_TRAIN_WORK_MS", 0) / 1000  # seconds of matmuls per optimizer step
        # FAKE_HOLD_AT=k: the update of version k waits for the test's file run_dir/release, after writing
        # run_dir/held (a trainer busy for as long as the test needs)
        self.hold_at, self.run_dir = knob("FAKE_HOLD_AT", -1), Path(context.run_dir)
        self.frozen_at_setup = gc.get_freeze_count()  # what the garbage collector no longer scans, at setup

    def __call__(self, batch):
        started = time.monotonic()
        compute_for(self.work_s)
        compute_s = time.monotonic() - started
        if self.version == self.hold_at:
            (self.run_dir / "held").touch()
            wait_for(self.run_dir / "release")
        record = {"version": self.version, "sample_ids": batch["sample_id"].tolist(),
                  "min_versions": [int(r.min()) for r in batch["versions"].rows()],
                  "advantages": batch["advantage"].tolist(), "compute_s": compute_s,
                  "frozen": [self.frozen_at_setup, gc.get_freeze_count()]}
        with self.log.open("a") as out:
            out.write(json.dumps(record) + "\n")
        self.version += 1
        if "FAKE_TRAIN_IN_PLACE" in os.environ:  # normalises its advantages where they lie
            batch["advantage"].sub_(batch["advantage"].mean())
        return None if "FAKE_TRAIN_RETURNS_NOTHING" in os.environ else {"loss": 0.0}

    def empty_step(self):
        self.version += 1

    def policy_weights(self):
        return {"version": torch.tensor([self.version])}

    def save_weights(self, path):
        if path is not None:
            save_file(self.policy_weights(), path)

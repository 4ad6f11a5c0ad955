"""Two branches of equal CPU work after a fake generator, run side by side or forced into one chain.

    BRANCHES_LAYOUT=parallel   left and right each in a pool of their own, both reading the generator;
                               a join node after them (its own pool: it joins two)
    BRANCHES_LAYOUT=chain      right reads left's output and has no pool of its own, so the compiler fuses
                               it into left's pool (a linear chain runs in one process), and the join with
                               them: one process does all the branch work, one node after the other

The generator and the trainer are fakes (no model: one token per sample, nothing trained), so the
branches' fixed matmul loops are nearly all the work. Every node appends one line per call to
`calls.jsonl` in the run directory (node, pid, start and end on the system-wide monotonic clock),
so a reader can see which calls overlapped in time and how busy each process was: the benchmark
(`bench_branches.py`) and its test (tests/benchmarks/test_bench_branches.py) read it.
Knobs are environment variables so one file serves both layouts.
"""

import json
import os
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from areal import Batch, Float, Graph, Int, Int32, Json, Ragged, RunConfig, node

LAYOUT = os.environ.get("BRANCHES_LAYOUT", "parallel")
WORK = int(os.environ.get("BRANCHES_WORK", "40"))  # matmuls per sample, in each branch node


def _compute(matmuls: int) -> None:
    """Fixed work (not a timed wait): a 128x128 matmul chain on one thread (map pools run one)."""
    x = torch.ones(128, 128)
    for _ in range(matmuls):
        x = torch.tanh(x @ x / 128)


class _Calls:
    """Appends (node, pid, start, end) of each call to RUN_DIR/calls.jsonl: one write per line, so lines
    from several processes never interleave."""

    def __init__(self, context):
        self.node = context.node
        self.path = Path(context.run_dir) / "calls.jsonl"

    def record(self, start: float, samples: int) -> None:
        line = json.dumps({"node": self.node, "pid": os.getpid(), "start": start, "end": time.monotonic(),
                           "samples": samples})
        with self.path.open("a") as out:
            out.write(line + "\n")


class Endless:
    fields = ("prompt",)

    def __init__(self):
        self.i = 0

    def __iter__(self):
        while True:
            self.i += 1
            yield {"prompt": f"p{self.i}"}

    def state(self):
        return {"i": self.i}

    def restore(self, state):
        self.i = state["i"]


@node(
    inputs={"prompt": Json["S"]},
    outputs={"prompt_ids": Int["S", "T"], "output_ids": Int["S", "T"], "behav_logp": Float["S", "T"],
             "versions": Int32["S", "T"], "signal": Float["S"]},
    kind="generate",
)
class FakeGenerate:
    """Finishes every queued group in one step: one token per sample, stamped with the version it holds."""

    def setup(self, context):
        self.version = context.version
        self.queue = []
        self.calls = _Calls(context)

    def submit(self, batch, meta):
        self.queue.append((batch, meta))

    def pending(self):
        return len(self.queue)

    def load_weights(self, weights, version):
        self.version = version

    def step(self):
        start = time.monotonic()
        done = [self._expand(batch, meta) for batch, meta in self.queue]
        self.queue = []
        self.calls.record(start, sum(b.size for b, _ in done))
        return done

    def _expand(self, batch, meta):
        k = meta.samples
        group = int(batch["group_id"][0])
        one = [torch.tensor([1]) for _ in range(k)]
        return Batch({
            "group_id": torch.full((k,), group), "sample_id": torch.arange(k) + group * k,
            "prompt_ids": Ragged.from_rows(one), "output_ids": Ragged.from_rows(one),
            "behav_logp": Ragged.from_rows([torch.zeros(1) for _ in range(k)]),
            "versions": Ragged.from_rows([torch.tensor([self.version], dtype=torch.int32) for _ in range(k)]),
            "signal": torch.ones(k),
        }), meta


@node(inputs={"signal": Float["S"]}, outputs={"value": Float["S"]})
class Branch:
    """WORK matmuls per sample: the equal work of each branch."""

    def setup(self, context):
        self.calls = _Calls(context)

    def __call__(self, batch):
        start = time.monotonic()
        for _ in range(batch.size):
            _compute(WORK)
        self.calls.record(start, batch.size)
        return {"value": batch["signal"]}


@node(inputs={"left": Float["S"], "right": Float["S"]}, outputs={"advantage": Float["S"]})
class Join:
    def setup(self, context):
        self.calls = _Calls(context)

    def __call__(self, batch):
        start = time.monotonic()
        out = {"advantage": batch["left"] - batch["right"]}
        self.calls.record(start, batch.size)
        return out


@node(
    inputs={"prompt_ids": Int["S", "T"], "output_ids": Int["S", "T"], "behav_logp": Float["S", "T"],
            "versions": Int32["S", "T"], "advantage": Float["S"]},
    outputs={},
    kind="ppo-update",
)
class FakeTrainer:
    """Trains nothing: counts versions, so the run's staleness and accounting work as with a model."""

    def setup(self, context):
        self.version = context.version
        self.calls = _Calls(context)

    def __call__(self, batch):
        self.calls.record(time.monotonic(), batch.size)
        self.version += 1
        return {"loss": 0.0}

    def empty_step(self):
        self.version += 1

    def policy_weights(self):
        return {"version": torch.tensor([self.version])}

    def save_weights(self, path):
        if path is not None:
            save_file(self.policy_weights(), path)


config = RunConfig(batch_size=4, group_size=4, staleness=4, steps=8)
chain = LAYOUT == "chain"
g = Graph(f"branches-{LAYOUT}")
g.source("tasks", Endless())  # prompt
g.add(FakeGenerate, name="rollout")  # prompt_ids, output_ids, behav_logp, versions, signal
g.add(Branch, name="left", pool=1)  # value
g.add(Branch, name="right", pool=None if chain else 1, take={"signal": "left.value"} if chain else {})  # value
g.add(Join, name="join", take={"left": "left.value", "right": "right.value"})  # advantage
g.add(FakeTrainer, name="actor")

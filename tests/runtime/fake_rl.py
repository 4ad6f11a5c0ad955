"""A recipe of small custom nodes shaped like RL (no model): source -> generate -> advantage -> trainer.

The nodes are in fake_nodes.py; knobs come from environment variables so one file serves every test.
"""

import os
import subprocess
import threading
from pathlib import Path

import torch

from areal import Float, Graph, Int, RunConfig, node
from areal.graph.roles import METRICS
from tests.runtime.fake_nodes import Counting, FakeGenerate, FakeTrainer, every_third_group

RAISE_ON_GROUP = int(os.environ["FAKE_RAISE_ON_GROUP"]) if "FAKE_RAISE_ON_GROUP" in os.environ else None
ADVANTAGE_POOL = int(os.environ.get("FAKE_ADVANTAGE_POOL", "0")) or None  # its own process when set
TOOLS = bool(os.environ.get("FAKE_TOOLS"))  # the advantage node starts a long-lived process per group
FILTER = bool(os.environ.get("FAKE_FILTER"))  # drop every third group whole, beside the advantage
REWARD = float(os.environ.get("FAKE_REWARD", "1"))  # a weighted reward: 0.7 for a sample that passed, say
HELDOUT = [{"prompt": f"h{i}"} for i in range(int(os.environ.get("FAKE_HELDOUT", "0")))] or None


@node(inputs={"group_id": Int["S"], "output_ids": Int["S", "T"]},
      outputs={"advantage": Float["S"], "reward": Float["S"], "passed": Float["S"]})
class advantage:  # noqa: N801 (named like the function nodes it stands beside)
    def setup(self, context):
        if "FAKE_SETUP_ERROR" in os.environ:
            raise ValueError(os.environ["FAKE_SETUP_ERROR"])
        hang = os.environ.get("FAKE_SETUP_HANG_ONCE")  # a file: the setup that finds it removes it and never returns
        if hang and os.path.exists(hang):
            os.unlink(hang)
            threading.Event().wait()
        self.tools_log = Path(context.run_dir) / "tools.txt"
        self.tools = []

    def __call__(self, batch):
        if TOOLS:  # a tool process per group, as an agent might start, kept running: "worker_pid tool_pid" logged
            self.tools.append(subprocess.Popen(["sleep", "600"]))
            with self.tools_log.open("a") as out:
                out.write(f"{os.getpid()} {self.tools[-1].pid}\n")
        if RAISE_ON_GROUP is not None and RAISE_ON_GROUP in batch["group_id"].tolist():
            raise ValueError(f"bad group {RAISE_ON_GROUP}")
        if ADVANTAGE_KIND == "nothing":  # forgot its return
            return None
        if ADVANTAGE_KIND in ("worded_metric", "undeclared"):
            extra = {METRICS: {"spread": "wide"}} if ADVANTAGE_KIND == "worded_metric" else {"spread": torch.ones(1)}
            return {"advantage": torch.zeros(batch.size), "reward": torch.zeros(batch.size),
                    "passed": torch.ones(batch.size), **extra}
        return {"advantage": ADVANTAGES[ADVANTAGE_KIND](batch), "reward": torch.full((batch.size,), REWARD),
                "passed": torch.ones(batch.size)}


# what the advantage node returns (FAKE_ADVANTAGE): well-formed, or one way of breaking its contract or its data
ADVANTAGES = {
    "zeros": lambda b: torch.zeros(b.size),
    "nan_in_odd_samples": lambda b: torch.where(b["sample_id"] % 2 == 1, float("nan"), 0.0),
    "int64": lambda b: torch.zeros(b.size, dtype=torch.int64),
    "two_dims": lambda b: torch.zeros(b.size, 5),
    "scalar": lambda b: torch.tensor(0.0),
    "in_place": lambda b: (b["output_ids"].values.mul_(1), torch.zeros(b.size))[1],  # a write, if not a change
}
ADVANTAGE_KIND = os.environ.get("FAKE_ADVANTAGE", "zeros")


config = RunConfig(batch_size=2, group_size=3, staleness=1, steps=6)
g = Graph("fake-rl")
g.source("tasks", Counting(), heldout=HELDOUT)
g.add(FakeGenerate, name="rollout")
g.add(advantage, pool=ADVANTAGE_POOL)
if FILTER:
    g.add(every_third_group)
g.add(FakeTrainer, name="actor")

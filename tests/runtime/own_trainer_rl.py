"""policy_rl.py with a trainer of the researcher's own that declares no `versions` port: it reads the advantage
and, when produced, the loss mask, and appends what it was given to `trained.jsonl` (the version it trains at,
its sample ids, each one's loss mask), so a test checks the runtime held it to η exactly as it holds ppo_update."""

import json

from areal import Float, Int, Int32, node
from tests.runtime.fake_nodes import FakeTrainer
from tests.runtime.policy_rl import config, policy_graph  # noqa: F401 (the recipe's config)


@node(inputs={"output_ids": Int["S", "T"], "advantage": Float["S"], "loss_mask": Int32["S", "T"]}, outputs={},
      role="trainer", optional={"loss_mask"})
class OwnTrainer(FakeTrainer.implementation):  # its version, empty step and weights: fake_nodes.py's trainer's
    def __call__(self, batch):
        masks = [row.tolist() for row in batch["loss_mask"].rows()] if "loss_mask" in batch else None
        with self.log.open("a") as out:
            out.write(json.dumps({"version": self.version, "sample_ids": batch["sample_id"].tolist(),
                                  "masks": masks, "ports": sorted(batch)}) + "\n")
        self.version += 1
        return {"loss": 0.0}


g = policy_graph(OwnTrainer)

"""Code RL with a trainer of your own: plain REINFORCE.   areal run recipes/reinforce_rl.py

The loop of code_rl.py, with its proximal pass and PPO update replaced by a trainer node written here:
−A · log π_θ(token), averaged over the batch's output tokens (those a loss mask keeps), one AdamW step
per batch. The runtime holds it to the staleness bound as it holds ppo_update: it checks η on the
versions the generator stamped (its node declares none), records each sample's lag and, under a
masking staleness policy, zeroes the old tokens in the `loss_mask` it hands it. docs/trainer-nodes.md
walks through it.
"""

import torch

from areal import Float, Graph, Int, Int32, RunConfig, node
from areal.config import GenerationConfig
from areal.data import code_tasks
from areal.engines import train_settings
from areal.engines.training.torch_train import TorchTrainEngine
from areal.kernels.advantage import group_normalise
from areal.nodes import generate, reward
from areal.nodes.workers.policy import full_sequences, load_run_policy, save_weights
from areal.rewards import code_tests

config = RunConfig(model="builtin:tiny-coder", batch_size=16, group_size=8, staleness=1, steps=60,
                   generation=GenerationConfig(max_batch=128))


@node(inputs={"reward": Float["S"], "group_id": Int["S"]}, outputs={"advantage": Float["S"]})
def group_advantage(batch):
    """GRPO: centre each reward on its prompt group and scale by the group's spread."""
    return {"advantage": group_normalise(batch["reward"], batch["group_id"])}


@node(inputs={"prompt_ids": Int["S", "T"], "output_ids": Int["S", "T"], "advantage": Float["S"],
              "loss_mask": Int32["S", "T"]}, outputs={}, role="trainer", optional={"loss_mask"})
class Reinforce:
    """REINFORCE with a group baseline (the advantage), the policy's own weights published after each step."""

    def setup(self, context):
        self.version = context.version  # the run's only counter of this model's versions: one more per step
        model, _ = load_run_policy(context.config)
        self.engine = TorchTrainEngine(model, train_settings(context.config))
        if context.resume_dir is not None:  # what save_checkpoint wrote, in the checkpoint being resumed
            self.engine.load(context.resume_dir / f"trainer-{context.node}")

    def __call__(self, batch):
        sequences, prompt_lens = full_sequences(batch["prompt_ids"], batch["output_ids"])
        masks = batch["loss_mask"].rows() if "loss_mask" in batch else [
            torch.ones(len(out), dtype=torch.int32) for out in batch["output_ids"].rows()]

        def loss(logp, mb):  # logp: log π_θ of the micro-batch's output tokens, packed
            kept = mb["mask"].to(logp.dtype)
            return -(mb.per_token(mb["advantage"]) * logp * kept).mean(), {}

        stats = self.engine.train_step(sequences, prompt_lens, loss,
                                       {"advantage": batch["advantage"].float(), "mask": masks}, lr_step=self.version)
        self.version += 1
        return {"loss": stats["loss"], "grad_norm": stats["grad_norm"]}

    def empty_step(self):  # every sample of the step failed or was filtered: no update, the version moves on
        self.version += 1

    def policy_weights(self):
        return self.engine.state_dict()

    def save_weights(self, path):  # the generators load this file; None: another rank writes it
        if path is not None:
            save_weights(self.policy_weights(), path)

    def save_checkpoint(self, folder):  # the optimizer's state beside the weights, so --resume continues it
        self.engine.save(folder, self.version)


g = Graph("reinforce-rl")
g.source("tasks", code_tasks("train"), heldout=code_tasks("test"))  # task_id, prompt, tests
g.add(generate("rollout"), pool=1)  # prompt_ids, output_ids, behav_logp, versions, completion, truncated
g.add(reward("score", code_tests(timeout_s=2.0)), pool=1)  # reward
g.add(group_advantage)  # advantage
g.add(Reinforce, name="actor")  # steps the optimizer, publishes version + 1

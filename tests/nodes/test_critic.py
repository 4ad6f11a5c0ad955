"""The actor-critic nodes: a critic starts at value 0 on the policy's backbone, GAE puts the reward on the
last token, and the critic's trainer regresses values on returns and resumes its own checkpoint."""

from __future__ import annotations

import types

import pytest
import torch

from areal.config import RunConfig
from areal.graph.batch import Batch, Ragged
from areal.kernels.advantage import gae
from areal.models.loading import load_policy
from areal.models.value import value_model
from areal.nodes.workers.critic import GAENode, ValuesNode, ValueTrainerNode
from areal.nodes.workers.policy import load_weights, save_weights
from tests.local_model import make_checkpoint


def _context(config: RunConfig, tmp_path, resume_dir=None, version=0):
    return types.SimpleNamespace(config=config, resume_dir=resume_dir, version=version, node="critic",
                                 run_dir=tmp_path)


def test_the_critic_has_the_policys_backbone_and_values_start_at_zero(tmp_path):
    policy, _ = load_policy(str(make_checkpoint(tmp_path / "ckpt")))
    critic = value_model(policy)
    backbone = policy.base_model.state_dict()
    assert all(torch.equal(critic.base_model.state_dict()[k], v) for k, v in backbone.items())
    values = critic(input_ids=torch.randint(4, 90, (2, 7))).logits
    assert values.shape == (2, 7, 1) and bool((values == 0).all())


def test_gae_puts_each_samples_reward_on_its_last_token(tmp_path):
    values = Ragged.from_rows([torch.tensor([0.1, 0.2, 0.3]), torch.tensor([]), torch.tensor([0.5, -0.5])])
    node = GAENode(gamma=0.9, lam=0.8, whiten=False)
    out = node(Batch({"values": values, "reward": torch.tensor([1.0, 7.0, 0.0])}))
    rewards = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0])  # the empty sample's 7.0 has no token to land on
    expected, returns = gae(rewards.double(), values.values.double(), values.offsets, gamma=0.9, lam=0.8)
    assert torch.allclose(out["advantage"].values.double(), expected, atol=1e-6)
    assert torch.allclose(out["returns"].values.double(), returns, atol=1e-6)
    assert out["advantage"].lengths.tolist() == [3, 0, 2]
    whitened = GAENode(gamma=0.9, lam=0.8, whiten=True)(Batch({"values": values,
                                                               "reward": torch.tensor([1.0, 7.0, 0.0])}))
    assert abs(float(whitened["advantage"].values.mean())) < 1e-6
    assert torch.allclose(whitened["returns"].values.double(), returns, atol=1e-6)  # returns are never whitened


def test_the_critic_learns_the_returns_publishes_weights_its_values_node_loads_and_resumes(tmp_path):
    torch.manual_seed(0)
    config = RunConfig(model=str(make_checkpoint(tmp_path / "ckpt")), trainer={"lr": 3e-3, "warmup_steps": 0})
    trainer = ValueTrainerNode(value_clip=None)
    trainer.setup(_context(config, tmp_path))
    scorer = ValuesNode(model="critic")
    scorer.setup(_context(config, tmp_path))
    prompt = torch.randint(4, 90, (6,))
    outputs = [torch.randint(4, 90, (5,)), torch.randint(4, 90, (4,))]
    batch = {"prompt_ids": Ragged.from_rows([prompt] * 2), "output_ids": Ragged.from_rows(outputs)}
    returns = Ragged.from_rows([torch.full((5,), 1.0), torch.full((4,), -1.0)])
    losses = []
    for _ in range(12):
        values = scorer(Batch(batch))["values"]
        losses.append(trainer(Batch({**batch, "values": values, "returns": returns}))["loss"])
        save_weights(trainer.policy_weights(), str(tmp_path / "critic.safetensors"))
        scorer.load_weights(load_weights(str(tmp_path / "critic.safetensors")), trainer.version)
    assert losses[0] == pytest.approx(0.5)  # values 0 against returns ±1
    assert losses[-1] < 0.5 * losses[0] and trainer.version == 12
    scored = scorer(Batch(batch))["values"]
    assert float(scored[0].mean()) > float(scored[1].mean())  # the scorer holds the trained critic
    trainer.save_checkpoint(str(tmp_path / "trainer-critic"))
    resumed = ValueTrainerNode(value_clip=None)
    resumed.setup(_context(config, tmp_path, resume_dir=tmp_path, version=12))
    same = zip(resumed.policy_weights().values(), trainer.policy_weights().values())
    assert all(torch.equal(a, b) for a, b in same)


def test_the_critic_takes_the_trainers_minibatches_and_epochs_as_a_version_of_steps_on_the_same_values(tmp_path):
    """2 minibatches x 2 epochs: 4 optimizer steps, one version; the weights are two one-pass versions' on the same
    batch (the same old values, a constant lr)."""
    checkpoint = make_checkpoint(tmp_path / "ckpt")
    torch.manual_seed(1)
    outputs = [torch.randint(4, 90, (n,)) for n in (5, 4, 6)]
    batch = Batch({"prompt_ids": Ragged.from_rows([torch.randint(4, 90, (6,))] * 3),
                   "output_ids": Ragged.from_rows(outputs),
                   "values": Ragged.from_rows([torch.zeros(len(o)) for o in outputs]),
                   "returns": Ragged.from_rows([torch.full((len(o),), r) for o, r in zip(outputs, (1.0, -1.0, 0.5))])})

    def trainer_with(epochs: int) -> ValueTrainerNode:
        config = RunConfig(model=str(checkpoint), trainer={"lr": 3e-3, "warmup_steps": 0, "minibatches": 2,
                                                           "epochs": epochs})
        trainer = ValueTrainerNode(value_clip=0.2)
        trainer.setup(_context(config, tmp_path))
        return trainer

    twice, once = trainer_with(2), trainer_with(1)
    stats = twice(batch)
    once(batch)
    once(batch)
    assert (twice.engine.step, twice.version, once.engine.step, once.version) == (4, 1, 4, 2)
    for name, tensor in once.engine.model.state_dict().items():
        torch.testing.assert_close(twice.engine.model.state_dict()[name], tensor, atol=1e-6, rtol=0, msg=name)
    assert stats["tokens"] == 2 * sum(map(len, outputs))  # counts add up over the passes

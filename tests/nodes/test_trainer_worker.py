"""The PPO update at the default config moves the policy the right way on a real (small) model."""

from __future__ import annotations

import types

import torch

from areal.config import RunConfig
from areal.graph.batch import Batch, Ragged
from areal.nodes.policy import full_sequences
from areal.nodes.trainer_worker import TrainerNode
from tests.local_model import make_checkpoint


def test_default_update_raises_the_rewarded_completion_and_lowers_the_other(tmp_path):
    torch.manual_seed(0)
    config = RunConfig(model=str(make_checkpoint(tmp_path / "ckpt")))
    trainer = TrainerNode()
    trainer.setup(types.SimpleNamespace(config=config, resume_dir=None, version=0, node="actor", run_dir=tmp_path))
    prompt = torch.randint(4, 90, (12,))
    outputs = [torch.randint(4, 90, (10,)), torch.randint(4, 90, (10,))]

    def sequence_logps() -> list[float]:
        seqs, lens = full_sequences(Ragged.from_rows([prompt, prompt]), Ragged.from_rows(outputs))
        return [float(lp[n - 1 :].sum()) for lp, n in zip(trainer.engine.sequence_logprobs(seqs), lens)]

    before = sequence_logps()
    for step in range(5):
        seqs, lens = full_sequences(Ragged.from_rows([prompt, prompt]), Ragged.from_rows(outputs))
        current = Ragged.from_rows([lp[n - 1 :] for lp, n in zip(trainer.engine.sequence_logprobs(seqs), lens)])
        trainer(Batch({
            "prompt_ids": Ragged.from_rows([prompt, prompt]), "output_ids": Ragged.from_rows(outputs),
            "behav_logp": current, "prox_logp": current, "advantage": torch.tensor([1.0, -1.0]),
            "versions": Ragged.from_rows([torch.full((10,), step, dtype=torch.int32)] * 2),
        }))
    after = sequence_logps()
    assert after[0] > before[0] and after[1] < before[1]
    assert trainer.version == 5


def test_a_sample_with_no_output_tokens_is_left_out_of_the_update(tmp_path):
    config = RunConfig(model=str(make_checkpoint(tmp_path / "ckpt")))
    prompt, output = torch.randint(4, 90, (12,)), torch.randint(4, 90, (10,))

    def weights_after(outputs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        trainer = TrainerNode()
        trainer.setup(types.SimpleNamespace(config=config, resume_dir=None, version=0, node="actor", run_dir=tmp_path))
        logp = Ragged.from_rows([torch.full((len(o),), -2.0) for o in outputs])
        trainer(Batch({
            "prompt_ids": Ragged.from_rows([prompt] * len(outputs)), "output_ids": Ragged.from_rows(outputs),
            "behav_logp": logp, "prox_logp": logp, "advantage": torch.ones(len(outputs)),
            "versions": Ragged.from_rows([torch.zeros(len(o), dtype=torch.int32) for o in outputs]),
        }))
        return trainer.engine.model.state_dict()

    with_empty, alone = weights_after([output, torch.zeros(0, dtype=torch.int64)]), weights_after([output])
    assert all(torch.equal(with_empty[k], alone[k]) for k in alone)

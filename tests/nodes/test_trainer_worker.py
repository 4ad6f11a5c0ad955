"""The PPO update at the default config moves the policy the right way on a real (small) model."""

from __future__ import annotations

import copy
import math
import re
import types

import pytest
import torch

from areal.config import RunConfig
from areal.engines.training.torch_train import NonFiniteUpdate
from areal.graph.batch import Batch, Ragged
from areal.models.loading import load_model
from areal.nodes.workers.policy import full_sequences
from areal.nodes.workers.trainer import ProximalNode, TrainerNode
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


def _batch(prompt: torch.Tensor, outputs: list[torch.Tensor], logp: Ragged) -> Batch:
    return Batch({
        "prompt_ids": Ragged.from_rows([prompt] * len(outputs)), "output_ids": Ragged.from_rows(outputs),
        "behav_logp": logp, "prox_logp": logp, "advantage": torch.linspace(-1, 1, len(outputs)),
        "versions": Ragged.from_rows([torch.zeros(len(o), dtype=torch.int32) for o in outputs]),
    })


def test_the_minibatches_of_one_version_share_its_lr_and_the_schedule_spans_the_versions(tmp_path):
    # steps=2 versions of 4 minibatches each: counted in optimizer steps, a cosine would reach 0 halfway
    config = RunConfig(model=str(make_checkpoint(tmp_path / "ckpt")), steps=2,
                       trainer={"minibatches": 4, "lr_schedule": "cosine", "warmup_steps": 0, "lr": 1e-3})
    trainer = TrainerNode()
    trainer.setup(types.SimpleNamespace(config=config, resume_dir=None, version=0, node="actor", run_dir=tmp_path))
    prompt = torch.randint(4, 90, (6,))
    outputs = [torch.randint(4, 90, (5,)) for _ in range(8)]
    logp = Ragged.from_rows([torch.full((5,), -2.0)] * 8)
    first = trainer(_batch(prompt, outputs, logp))
    second = trainer(_batch(prompt, outputs, logp))
    assert trainer.engine.step == 8 and trainer.version == 2
    assert first["lr"] == pytest.approx(1e-3)  # version 0: the peak, for each of its 4 steps
    assert second["lr"] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 0.5)))  # version 1 of 2


@pytest.mark.parametrize("minibatches", [1, 2])
def test_epochs_pass_over_the_batch_again_within_one_version_as_a_second_version_on_it_would(tmp_path, minibatches):
    """trainer.epochs=2: 2 x `minibatches` optimizer steps, one version; the weights are those of two versions of one
    pass each on the same batch (the same π_prox, a constant lr). With one minibatch the first pass's ratio is 1, so
    the clip acts only in the second, where π_θ has left π_prox; counts add up over the passes."""
    checkpoint = make_checkpoint(tmp_path / "ckpt")
    torch.manual_seed(3)
    prompt, outputs = torch.randint(4, 90, (6,)), [torch.randint(4, 90, (n,)) for n in (5, 7, 3, 6)]
    batch = _batch(prompt, outputs, Ragged.from_rows([torch.full((len(o),), -2.0) for o in outputs]))

    def trainer_with(epochs: int) -> TrainerNode:
        config = RunConfig(model=str(checkpoint), trainer={"epochs": epochs, "minibatches": minibatches, "lr": 0.05,
                                                           "warmup_steps": 0})
        trainer = TrainerNode()
        trainer.setup(types.SimpleNamespace(config=config, resume_dir=None, version=0, node="actor",
                                            run_dir=tmp_path))
        return trainer

    twice, once = trainer_with(2), trainer_with(1)
    proximal = ProximalNode()  # π_prox = π_behav = the starting policy's own: the first step's ratio is 1
    proximal.setup(types.SimpleNamespace(config=RunConfig(model=str(checkpoint)),
                                         pool=types.SimpleNamespace(name="actor")))
    now = proximal(batch)["prox_logp"]
    batch = Batch({**{k: batch[k] for k in batch}, "prox_logp": now, "behav_logp": now})
    stats = twice(batch)
    first, second = once(batch), once(batch)
    steps = 2 * minibatches
    assert (twice.engine.step, twice.version) == (steps, 1) and (once.engine.step, once.version) == (steps, 2)
    for name, tensor in once.engine.model.state_dict().items():
        torch.testing.assert_close(twice.engine.model.state_dict()[name], tensor, atol=1e-6, rtol=0, msg=name)
    if minibatches == 1:
        assert first["clip_fraction"] == 0.0 < second["clip_fraction"]
    assert stats["valid_tokens"] == first["valid_tokens"] + second["valid_tokens"] == 2 * sum(map(len, outputs))
    assert stats["clip_fraction"] == pytest.approx((first["clip_fraction"] + second["clip_fraction"]) / 2)


@pytest.mark.parametrize(("objective", "forward"), [("decoupled", True), ("standard", False)])
def test_the_proximal_pass_follows_the_trainers_own_objective(tmp_path, objective, forward):
    # the run's section says the opposite: the node's setting is the one that counts
    other = "standard" if objective == "decoupled" else "decoupled"
    run = RunConfig(model=str(make_checkpoint(tmp_path / "ckpt")), trainer={"objective": other})
    own = run.model_copy(update={"trainer": run.trainer.model_copy(update={"objective": objective})})
    trainer, proximal = TrainerNode(), ProximalNode()
    trainer.setup(types.SimpleNamespace(config=own, resume_dir=None, version=0, node="actor", run_dir=tmp_path))
    proximal.setup(types.SimpleNamespace(config=run, pool=types.SimpleNamespace(name="actor")))
    prompt, outputs = torch.randint(4, 90, (6,)), [torch.randint(4, 90, (5,)) for _ in range(2)]
    behav = Ragged.from_rows([torch.full((5,), -2.0)] * 2)
    prox = proximal(_batch(prompt, outputs, behav))["prox_logp"]
    assert torch.equal(prox.values, behav.values) is not forward


@pytest.mark.parametrize(("setting", "minibatches", "reused"), [("auto", 1, True), ("off", 1, False),
                                                                ("auto", 2, False)])
def test_the_update_reuses_the_proximal_forward_as_set_and_moves_the_weights_the_same_either_way(
        tmp_path, setting, minibatches, reused):
    checkpoint = make_checkpoint(tmp_path / "ckpt")
    prompt, outputs = torch.randint(4, 90, (6,)), [torch.randint(4, 90, (n,)) for n in (5, 7, 3, 6)]
    behav = Ragged.from_rows([torch.full((len(o),), -2.0) for o in outputs])

    def step(reuse: str) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        config = RunConfig(model=str(checkpoint), trainer={"reuse_proximal_forward": reuse,
                                                           "minibatches": minibatches, "entropy_coef": 0.5})
        trainer, proximal = TrainerNode(), ProximalNode()
        trainer.setup(types.SimpleNamespace(config=config, resume_dir=None, version=0, node="actor", run_dir=tmp_path))
        proximal.setup(types.SimpleNamespace(config=config, pool=types.SimpleNamespace(name="actor")))
        batch = _batch(prompt, outputs, behav)
        batch = Batch({**{k: batch[k] for k in batch}, "prox_logp": proximal(batch)["prox_logp"]})
        return trainer(batch), trainer.engine.model.state_dict()

    stats, weights = step(setting)
    assert stats["reused_forward"] == float(reused)
    own_stats, own_forward = step("off")  # the entropy bonus's gradient too, through a kept forward or its own
    assert stats["entropy"] == pytest.approx(own_stats["entropy"], rel=1e-6)
    for name, tensor in own_forward.items():
        torch.testing.assert_close(weights[name], tensor, atol=1e-6, rtol=0, msg=name)


def test_reusing_the_proximal_forward_is_refused_where_the_trainer_runs_no_single_one():
    with pytest.raises(ValueError, match=r"reuse_proximal_forward=on .* minibatches=2 \(needs 1\), "
                                         r"objective=standard \(needs decoupled\)"):
        RunConfig(trainer={"reuse_proximal_forward": "on", "minibatches": 2, "objective": "standard"})
    with pytest.raises(ValueError, match=r"model_dropout=True \(needs False\), lora.dropout=0.1 \(needs 0.0\)"):
        RunConfig(trainer={"reuse_proximal_forward": "on", "model_dropout": True, "lora": {"rank": 4, "dropout": 0.1}})
    # auto keeps its own forward where dropout acts in it: the proximal pass runs without dropout
    assert not RunConfig(trainer={"model_dropout": True}).trainer.reuses_proximal_forward(on_cpu=True)
    assert not RunConfig(trainer={"lora": {"rank": 4, "dropout": 0.1}}).trainer.reuses_proximal_forward(on_cpu=True)
    assert RunConfig(trainer={"lora": {"rank": 0, "dropout": 0.1}}).trainer.reuses_proximal_forward(on_cpu=True)


def test_an_advantage_that_overflows_the_loss_stops_the_update_naming_the_version(tmp_path):
    config = RunConfig(model=str(make_checkpoint(tmp_path / "ckpt")))
    trainer = TrainerNode()
    trainer.setup(types.SimpleNamespace(config=config, resume_dir=None, version=3, node="actor", run_dir=tmp_path))
    before = {k: v.clone() for k, v in trainer.engine.model.state_dict().items()}
    prompt, outputs = torch.randint(4, 90, (6,)), [torch.randint(4, 90, (5,)) for _ in range(4)]
    batch = _batch(prompt, outputs, Ragged.from_rows([torch.full((5,), -2.0)] * 4))
    huge = Batch({**batch, "advantage": torch.full((4,), 3e38)})  # finite, but the loss's sum is not
    with pytest.raises(NonFiniteUpdate, match=r"training version 4: optimizer step 0: the loss is -?inf"):
        trainer(huge)
    assert trainer.version == 3
    assert all(torch.equal(before[k], v) for k, v in trainer.policy_weights().items())


def test_weights_holding_a_nan_are_never_handed_out_for_publishing_or_checkpoints(tmp_path):
    config = RunConfig(model=str(make_checkpoint(tmp_path / "ckpt")))
    trainer = TrainerNode()
    trainer.setup(types.SimpleNamespace(config=config, resume_dir=None, version=2, node="actor", run_dir=tmp_path))
    name, param = next(iter(trainer.engine.model.named_parameters()))
    with torch.no_grad():
        param.view(-1)[0] = float("nan")
    with pytest.raises(NonFiniteUpdate, match=rf"version 2: weights {re.escape(name)}.* neither published nor"):
        trainer.save_weights(str(tmp_path / "v2.safetensors"))
    assert not (tmp_path / "v2.safetensors").exists()


def test_token_advantages_equal_to_the_spread_per_sample_ones_train_the_same_weights(tmp_path):
    config = RunConfig(model=str(make_checkpoint(tmp_path / "ckpt")))
    prompt = torch.randint(4, 90, (8,))
    outputs = [torch.randint(4, 90, (6,)), torch.randint(4, 90, (3,))]
    per_sample = torch.tensor([0.7, -1.3])

    def weights_after(advantage) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        trainer = TrainerNode()
        trainer.setup(types.SimpleNamespace(config=config, resume_dir=None, version=0, node="actor", run_dir=tmp_path))
        logp = Ragged.from_rows([torch.full((len(o),), -2.0) for o in outputs])
        stats = trainer(Batch({
            "prompt_ids": Ragged.from_rows([prompt] * 2), "output_ids": Ragged.from_rows(outputs),
            "behav_logp": logp, "prox_logp": logp, "advantage": advantage,
            "versions": Ragged.from_rows([torch.zeros(len(o), dtype=torch.int32) for o in outputs]),
        }))
        assert stats["zero_advantage"] == 0.0
        return {k: v.clone() for k, v in trainer.engine.model.state_dict().items()}

    spread = weights_after(Ragged.from_rows([torch.full((len(o),), float(a)) for o, a in zip(outputs, per_sample)]))
    assert all(torch.equal(a, b) for a, b in zip(weights_after(per_sample).values(), spread.values()))
    # and a token's own advantage counts: flipping one token's sign trains something else
    varied = weights_after(Ragged.from_rows([torch.tensor([0.7, 0.7, -0.7, 0.7, 0.7, 0.7]), torch.full((3,), -1.3)]))
    assert any(not torch.equal(a, b) for a, b in zip(varied.values(), spread.values()))


def test_a_loss_mask_trains_only_the_sampled_tokens_as_a_mean_over_them_across_microbatches(tmp_path):
    # an episode's tool tokens (mask 0) carry behav_logp 0: were they trained, their weight exp(prox - 0) and the
    # token count would both change the gradient. Reference: -Σ_trained A·logπ_θ / (trained tokens), u = w = 1.
    config = RunConfig(model=str(make_checkpoint(tmp_path / "ckpt")),
                       trainer={"grad_clip": 1e9, "microbatch_tokens": 24, "warmup_steps": 0})
    trainer = TrainerNode()
    trainer.setup(types.SimpleNamespace(config=config, resume_dir=None, version=0, node="actor", run_dir=tmp_path))
    torch.manual_seed(1)
    prompts = [torch.randint(4, 90, (n,)) for n in (5, 7, 4)]
    outputs = [torch.randint(4, 90, (n,)) for n in (9, 6, 11)]
    masks = [torch.tensor(m, dtype=torch.int32) for m in
             ([1, 1, 1, 0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1])]
    advantage = torch.tensor([1.0, -0.5, 2.0])
    seqs, lens = full_sequences(Ragged.from_rows(prompts), Ragged.from_rows(outputs))
    current = [lp[n - 1 :].detach() for lp, n in zip(trainer.engine.sequence_logprobs(seqs), lens)]
    behav = Ragged.from_rows([torch.where(m.bool(), lp, torch.zeros_like(lp)) for lp, m in zip(current, masks)])

    model = trainer.engine.model
    model.zero_grad()
    logps = trainer.engine.sequence_logprobs(seqs, no_grad=False)
    trained = sum(int(m.sum()) for m in masks)
    loss = -sum(a * (lp[n - 1 :] * m).sum() for a, lp, n, m in zip(advantage, logps, lens, masks)) / trained
    loss.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()

    seen: dict[str, torch.Tensor] = {}
    step = trainer.engine.optimizer.step

    def record(*args, **kwargs):
        seen.update({name: p.grad.clone() for name, p in model.named_parameters()})
        return step(*args, **kwargs)

    trainer.engine.optimizer.step = record
    stats = trainer(Batch({
        "prompt_ids": Ragged.from_rows(prompts), "output_ids": Ragged.from_rows(outputs), "behav_logp": behav,
        "prox_logp": Ragged.from_rows(current), "advantage": advantage, "loss_mask": Ragged.from_rows(masks),
        "versions": Ragged.from_rows([torch.zeros(len(o), dtype=torch.int32) for o in outputs]),
    }))
    assert stats["microbatches"] >= 2  # the mean over trained tokens holds across micro-batches
    for name, grad in expected.items():
        torch.testing.assert_close(seen[name], grad, rtol=1e-4, atol=1e-7)


def test_a_steps_counts_are_sums_over_its_samples_and_its_maximum_the_largest_over_micro_and_minibatches(tmp_path):
    # four micro-batches a minibatch, two minibatches: a mean over them would turn the counts into averages
    config = RunConfig(model=str(make_checkpoint(tmp_path / "ckpt")),
                       trainer={"minibatches": 2, "microbatch_tokens": 40, "behav_weight_cap": 1.5})
    trainer = TrainerNode()
    trainer.setup(types.SimpleNamespace(config=config, resume_dir=None, version=0, node="actor", run_dir=tmp_path))
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(4, 90, (6,), generator=g)
    outputs = [torch.randint(4, 90, (int(n),), generator=g) for n in torch.randint(5, 15, (12,), generator=g)]
    masks = [torch.randint(0, 2, (len(o),), generator=g, dtype=torch.int32) for o in outputs]
    seqs, lens = full_sequences(Ragged.from_rows([prompt] * 12), Ragged.from_rows(outputs))
    prox = [lp[n - 1 :] for lp, n in zip(trainer.engine.sequence_logprobs(seqs), lens)]
    behav = [p - torch.rand(len(p), generator=g) for p in prox]  # w = π_prox / π_behav in [1, e]
    batch = _batch(prompt, outputs, Ragged.from_rows(behav)).merge(
        {"prox_logp": Ragged.from_rows(prox), "loss_mask": Ragged.from_rows(masks)})
    stats = trainer(batch)
    weights = torch.cat([(p.double() - b.double()).exp() for p, b in zip(prox, behav)])
    kept = torch.cat(masks).bool()
    assert stats["microbatches"] >= 6 and stats["tokens"] == sum(len(o) for o in outputs)
    assert stats["valid_tokens"] == int(kept.sum())  # every mask-1 token of the step, counted once
    assert stats["capped_tokens"] == int((weights[kept] > 1.5).sum()) > 0
    assert stats["importance_weight_max"] == pytest.approx(float(weights[kept].max()), rel=1e-5)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_the_loss_averages_as_loss_agg_says_over_samples_of_different_lengths(tmp_path, agg):
    """At the step's own weights (u = 1, nothing clipped) the loss is −mean of w·A as `agg` takes it, w the
    importance weight π_prox/π_behav of each token: checked against float64 sums written out here."""
    config = RunConfig(model=str(make_checkpoint(tmp_path / "ckpt")), generation={"max_new_tokens": 12},
                       trainer={"loss_agg": agg})
    trainer, proximal = TrainerNode(), ProximalNode()
    trainer.setup(types.SimpleNamespace(config=config, resume_dir=None, version=0, node="actor", run_dir=tmp_path))
    proximal.setup(types.SimpleNamespace(config=config, pool=types.SimpleNamespace(name="actor")))
    torch.manual_seed(1)
    prompt, outputs = torch.randint(4, 90, (6,)), [torch.randint(4, 90, (n,)) for n in (2, 9, 5, 12)]
    batch = _batch(prompt, outputs, Ragged.from_rows([torch.full((len(o),), -2.0) for o in outputs]))
    prox = proximal(batch)["prox_logp"]
    behav = Ragged.from_rows([p + 0.1 * torch.randn(len(p)) for p in prox.rows()])
    batch = Batch({**{k: batch[k] for k in batch}, "prox_logp": prox, "behav_logp": behav})
    terms = [torch.exp(p.double() - b.double()) * a for p, b, a in
             zip(prox.rows(), behav.rows(), batch["advantage"].double(), strict=True)]
    expected = {"token-mean": torch.cat(terms).mean(),
                "seq-mean-token-mean": torch.stack([t.mean() for t in terms]).mean(),
                "seq-mean-token-sum": torch.stack([t.sum() / 12 for t in terms]).mean()}[agg]
    stats = trainer(batch)
    assert stats["clip_fraction"] == 0.0 and stats["loss"] == pytest.approx(-float(expected), rel=1e-5)


@pytest.mark.parametrize(("settings", "gap", "clipped", "dual"), [
    ({}, 0.25, 0.5, None),  # u = e^0.25 ≈ 1.28: past 1 + 0.2 where A > 0 (half the tokens)
    ({"clip_eps_high": 0.3}, 0.25, 0.0, None),  # clip-higher: inside 1 + 0.3
    ({"dual_clip": 3.0}, 2.0, 0.5, 0.5),  # u = e^2 ≈ 7.4 where A < 0: floored at 3·A
])
def test_the_clip_settings_reach_the_loss(tmp_path, settings, gap, clipped, dual):
    config = RunConfig(model=str(make_checkpoint(tmp_path / "ckpt")), trainer=settings)
    trainer, proximal = TrainerNode(), ProximalNode()
    trainer.setup(types.SimpleNamespace(config=config, resume_dir=None, version=0, node="actor", run_dir=tmp_path))
    proximal.setup(types.SimpleNamespace(config=config, pool=types.SimpleNamespace(name="actor")))
    prompt, outputs = torch.randint(4, 90, (6,)), [torch.randint(4, 90, (5,)) for _ in range(4)]
    batch = _batch(prompt, outputs, Ragged.from_rows([torch.full((5,), -2.0)] * 4))
    now = proximal(batch)["prox_logp"]  # this step's own log-probs: u = π_θ/π_prox = e^gap below
    older = Ragged(now.values - gap, now.offsets)
    stats = trainer(Batch({**{k: batch[k] for k in batch}, "prox_logp": older, "behav_logp": older,
                           "advantage": torch.tensor([-1.0, -0.5, 0.5, 1.0])}))
    assert stats["clip_fraction"] == pytest.approx(clipped)
    assert stats.get("dual_clip_fraction") == (None if dual is None else pytest.approx(dual))


@pytest.mark.parametrize("ratio", ["token", "sequence"])
def test_a_sequence_ratio_clips_samples_where_a_token_ratio_clips_tokens(tmp_path, ratio):
    """π_θ/π_prox at e^+0.5 and e^-0.5 on alternate tokens: per token, the tokens past 1 ± 0.2 in the advantage's
    direction clip; per sample (GSPO) each sample's ratio is e^0 = 1 and nothing clips, so the loss is −mean(A)
    over the tokens (float64)."""
    config = RunConfig(model=str(make_checkpoint(tmp_path / "ckpt")), trainer={"ratio": ratio})
    trainer, proximal = TrainerNode(), ProximalNode()
    trainer.setup(types.SimpleNamespace(config=config, resume_dir=None, version=0, node="actor", run_dir=tmp_path))
    proximal.setup(types.SimpleNamespace(config=config, pool=types.SimpleNamespace(name="actor")))
    prompt, outputs = torch.randint(4, 90, (6,)), [torch.randint(4, 90, (n,)) for n in (4, 6, 2, 8)]
    batch = _batch(prompt, outputs, Ragged.from_rows([torch.full((len(o),), -2.0) for o in outputs]))
    now = proximal(batch)["prox_logp"]
    gaps = Ragged.from_rows([torch.tensor([0.5, -0.5] * (len(o) // 2)) for o in outputs])
    older = Ragged(now.values - gaps.values, now.offsets)  # log u = gap, token by token
    advantage = torch.tensor([1.0, -1.0, 0.5, -0.5])
    stats = trainer(Batch({**{k: batch[k] for k in batch}, "prox_logp": older, "behav_logp": older,
                           "advantage": advantage}))
    per_token = torch.cat([torch.full((len(o),), float(a)) for o, a in zip(outputs, advantage)]).double()
    if ratio == "sequence":
        assert stats["clip_fraction"] == 0.0
        assert stats["loss"] == pytest.approx(-float(per_token.mean()), rel=1e-5, abs=1e-7)
    else:  # A > 0 clips where u = e^0.5 > 1.2, A < 0 where u = e^-0.5 < 0.8: half of every sample's tokens
        assert stats["clip_fraction"] == pytest.approx(0.5)
    assert stats["approx_kl"] == pytest.approx(0.0, abs=1e-6)  # the tokens' mean log π_prox/π_θ either way


def _tempered_entropy(model: torch.nn.Module, prompt: list[int], outputs: list[torch.Tensor], temperature: float):
    """float64: the entropy of softmax(logits / temperature) at each output token's position, sample by sample."""
    with torch.no_grad():
        model = copy.deepcopy(model).double()
        rows = []
        for out in outputs:
            logits = model(torch.tensor([prompt + out.tolist()])).logits[0, len(prompt) - 1 : -1]
            p = torch.log_softmax(logits / temperature, dim=-1)
            rows.append(-(p.exp() * p).sum(-1))
    return torch.cat(rows)


def test_the_steps_entropy_is_the_policys_own_over_the_trained_tokens_and_the_drawn_tokens_agree(tmp_path):
    """Tokens drawn by the generator at temperature 0.7: the step's `entropy` is the tempered policy's exact entropy
    at their positions (float64, from the update's own forward); the drawn tokens' mean −log π_behav estimates the
    same number within four standard errors."""
    from areal.config import GenerationConfig
    from areal.engines import torch_generation_engine
    from areal.engines.generation import GenRequest

    model = load_model(make_checkpoint(tmp_path / "ckpt"))
    engine = torch_generation_engine(model, GenerationConfig(max_batch=64), eos_token_id=None, pad_token_id=0,
                                     max_new_tokens=12, temperature=0.7, seed=3)
    prompt = [5, 17, 33, 8]
    results = engine.generate([GenRequest(i, prompt) for i in range(64)])
    drawn = torch.cat([r.logprobs.double() for r in results])
    exact = _tempered_entropy(model, prompt, [r.output_ids for r in results], 0.7)
    config = RunConfig(model=str(tmp_path / "ckpt"), generation={"temperature": 0.7})
    trainer = TrainerNode()
    trainer.setup(types.SimpleNamespace(config=config, resume_dir=None, version=0, node="actor", run_dir=tmp_path))
    logp = Ragged.from_rows([r.logprobs for r in results])
    stats = trainer(Batch({"prompt_ids": Ragged.from_rows([torch.tensor(prompt)] * 64),
                           "output_ids": Ragged.from_rows([r.output_ids for r in results]), "behav_logp": logp,
                           "prox_logp": logp, "advantage": torch.zeros(64),
                           "versions": Ragged.from_rows([torch.zeros(len(r.output_ids), dtype=torch.int32)
                                                         for r in results])}))
    assert stats["entropy"] == pytest.approx(float(exact.mean()), rel=1e-5)
    error = float((-drawn - exact).std()) / len(drawn) ** 0.5
    assert abs(float(-drawn.mean()) - float(exact.mean())) < 4 * error


@pytest.mark.parametrize("coef", [0.0, 0.3])
def test_the_entropy_bonus_is_coef_times_the_mean_entropy_of_the_trained_tokens_taken_from_the_loss(tmp_path, coef):
    """With no policy-gradient term (advantages 0) the loss is −coef · H over the loss-mask tokens (float64), and the
    bonus's gradient raises the entropy at those positions (one step, lr 1e-2, the bonus alone; at temperature 0.5,
    where the random model is a little further from uniform)."""
    checkpoint = make_checkpoint(tmp_path / "ckpt")
    config = RunConfig(model=str(checkpoint), trainer={"entropy_coef": coef, "lr": 1e-2},
                       generation={"temperature": 0.5})
    trainer, proximal = TrainerNode(), ProximalNode()
    trainer.setup(types.SimpleNamespace(config=config, resume_dir=None, version=0, node="actor", run_dir=tmp_path))
    proximal.setup(types.SimpleNamespace(config=config, pool=types.SimpleNamespace(name="actor")))
    torch.manual_seed(2)
    prompt, outputs = torch.randint(4, 90, (6,)), [torch.randint(4, 90, (n,)) for n in (4, 7, 5)]
    mask = [torch.tensor([1, 1, 0, 0]), torch.tensor([0, 1, 1, 1, 0, 1, 1]), torch.ones(5, dtype=torch.int64)]
    batch = _batch(prompt, outputs, Ragged.from_rows([torch.full((len(o),), -2.0) for o in outputs]))
    batch = Batch({**{k: batch[k] for k in batch}, "advantage": torch.zeros(3), "loss_mask": Ragged.from_rows(mask)})
    batch = Batch({**{k: batch[k] for k in batch}, "prox_logp": proximal(batch)["prox_logp"]})
    trained = torch.cat(mask).bool()
    before = _tempered_entropy(trainer.engine.model, prompt.tolist(), outputs, 0.5)[trained].mean()
    stats = trainer(batch)
    assert stats["entropy"] == pytest.approx(float(before), rel=1e-5)
    assert stats["loss"] == pytest.approx(-coef * float(before), rel=1e-5, abs=1e-9)
    after = _tempered_entropy(trainer.engine.model, prompt.tolist(), outputs, 0.5)[trained].mean()
    assert float(after - before) > 1e-3 if coef else float(after - before) == 0.0


def test_an_entropy_bonus_is_refused_on_the_emulated_engine_which_has_no_distributions():
    with pytest.raises(ValueError, match=r"entropy_coef=0.01: the emulated engine has no distributions"):
        RunConfig(trainer={"engine": "emulated", "entropy_coef": 0.01})

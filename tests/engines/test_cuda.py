"""The engines on a CUDA GPU (gpu-marked; run on a lent GPU by benchmarks/gpu/run.sh): what the CPU tests show
on the CPU, shown again where the tensors live on the device and every boundary (batches, files, collectives)
must bring them back to the host."""

from __future__ import annotations

import copy

import pytest
import torch

from areal.engines import GenRequest, TorchGenerationEngine
from areal.engines.training.micro_batch import MicroBatch
from areal.engines.training.torch_train import TorchTrainEngine
from areal.engines.training.trainer_settings import TrainSettings
from areal.kernels.ppo import decoupled_ppo_loss
from areal.kernels.shared_prefix import row_positions
from areal.nodes.workers.policy import load_weights, save_weights
from tests.engines.conftest import tiny_qwen2
from tests.engines.test_shared_prefix import grouped_batch
from tests.engines.test_shared_prefix import loss as advantage_loss
from tests.spawned import run_spawned

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA = torch.device("cuda")
EOS_NEVER = 100  # outside the 100-token vocabulary: rows run to their length


def ppo_loss(logp: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
    loss, stats = decoupled_ppo_loss(logp, mb["prox_logp"], mb["behav_logp"], mb.per_token(mb["advantage"]),
                                     torch.ones_like(logp, dtype=torch.bool))
    return loss, {"clip_fraction": float(stats.clip_fraction)}


def assert_same_step(moved: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], lr: float) -> None:
    """AdamW's first step moves each weight by about lr·sign(g): where |g| is near Adam's eps the sign can differ
    between two roundings, so all but a sliver of each tensor must agree to 1 % of lr, and none by over 2·lr."""
    for name, want in reference.items():
        diff = (moved[name].detach().double().cpu() - want.detach().double().cpu()).abs()
        assert float(diff.max()) <= 2 * lr + 1e-6, name
        assert float((diff <= 0.01 * lr + 1e-7).double().mean()) > 0.99, name


def _batch(seed: int) -> tuple[list[torch.Tensor], list[int]]:
    g = torch.Generator().manual_seed(seed)
    sequences = [torch.randint(0, 100, (n,), generator=g) for n in (9, 14, 6, 11)]
    return sequences, [3, 5, 2, 4]


def test_generation_on_cuda_records_what_the_trainer_computes_across_a_weight_update():
    """π_behav from the engine equals π_prox from the trainer's forward on the same device, before and after new
    weights land mid-sequence (the decoupled objective's importance weight is 1 when nothing changed)."""
    model = tiny_qwen2(0).to(CUDA)
    engine = TorchGenerationEngine(model, eos_token_id=EOS_NEVER, pad_token_id=0, max_batch=4, seed=3)
    engine.submit([GenRequest(i, [5 + i, 7, 9 + i], 12) for i in range(4)])
    for _ in range(4):
        assert engine.step() == []
    before = len(engine._active[0].output)  # the first step both prefills (one token) and decodes (another)
    new = tiny_qwen2(1)
    engine.update_weights(new.state_dict(), version=1)  # host tensors into a device model, as a run delivers them
    results = []
    while engine.pending():
        results += engine.step()
    assert len(results) == 4
    for r in results:
        assert r.output_ids.device.type == "cpu" and r.versions.tolist() == [0] * before + [1] * (12 - before)
    sequences = [torch.cat([r.prompt_ids, r.output_ids]) for r in results]
    for version, weights in ((0, tiny_qwen2(0)), (1, new)):
        trainer = TorchTrainEngine(weights, device=CUDA)
        logps = trainer.sequence_logprobs(sequences)
        for r, lp in zip(results, logps, strict=True):
            assert lp.device.type == "cpu"  # what leaves the trainer as a batch is on the host
            mine = r.versions == version
            torch.testing.assert_close(lp[len(r.prompt_ids) - 1 :][mine], r.logprobs[mine], atol=1e-4, rtol=1e-4)


def test_a_cuda_train_step_matches_a_float64_cpu_reference():
    sequences, prompt_lens = _batch(1)
    reference = TorchTrainEngine(tiny_qwen2(0).double(), TrainSettings(lr=1e-3))
    device = TorchTrainEngine(tiny_qwen2(0), TrainSettings(lr=1e-3), device=CUDA)
    behaviour = [lp[p - 1 :].float() - 0.05 for lp, p in zip(reference.sequence_logprobs(sequences), prompt_lens)]
    extra = {"behav_logp": behaviour, "prox_logp": [b + 0.05 for b in behaviour],
             "advantage": torch.tensor([1.0, -0.5, 0.25, -1.0])}
    want = reference.train_step(sequences, prompt_lens, ppo_loss, extra)
    got = device.train_step(sequences, prompt_lens, ppo_loss, extra)
    for key in ("loss", "grad_norm", "clip_fraction", "tokens"):
        assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    assert_same_step(dict(device.model.named_parameters()), dict(reference.model.named_parameters()), lr=1e-3)


def test_shared_prompt_rows_on_cuda_give_what_one_row_a_sequence_gives():
    """The trainer's shared prompt rows (a 4D mask to sdpa) on the device: each sequence's log-probs, and the step
    they train, as with one row a sequence (in float64 on the CPU: tests/engines/test_shared_prefix.py)."""
    sequences, prompt_lens, _ = grouped_batch()
    engines = {shared: TorchTrainEngine(tiny_qwen2(0), TrainSettings(lr=1e-3, microbatch_tokens=64,
                                                                     shared_prefixes=shared), device=CUDA)
               for shared in (True, False)}
    assert engines[True].shared_prefixes and not engines[False].shared_prefixes
    assert row_positions(sequences, engines[True]._microbatches(sequences)) < sum(len(s) for s in sequences)
    shared, plain = (engines[k].sequence_logprobs(sequences) for k in (True, False))
    for got, want in zip(shared, plain, strict=True):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
    g = torch.Generator().manual_seed(1)
    advantage = [torch.randn(len(s) - p, generator=g) for s, p in zip(sequences, prompt_lens, strict=True)]
    for engine in engines.values():
        engine.train_step(sequences, prompt_lens, advantage_loss, {"advantage": advantage})
    assert_same_step(dict(engines[True].model.named_parameters()), dict(engines[False].model.named_parameters()),
                     lr=1e-3)


def test_weights_published_from_cuda_are_host_files_with_tied_tensors_apart(tmp_path):
    model = tiny_qwen2(0).to(CUDA)
    path = tmp_path / "v000001.safetensors"
    save_weights(model.state_dict(), str(path))
    loaded = load_weights(str(path))
    assert set(loaded) == set(model.state_dict())  # the tied head under its own name too
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded[name], tensor.cpu()), name


def _fsdp_matches_torch_on_nccl(rank: int, sequences: list, prompt_lens: list, extra: dict) -> None:
    from areal.engines.training.fsdp_train import FSDPTrainEngine, join_process_group

    assert join_process_group("cuda") == "cuda"
    assert torch.distributed.get_backend() == "nccl"
    fsdp = FSDPTrainEngine(tiny_qwen2(0), TrainSettings(lr=1e-3), device=CUDA)
    local = TorchTrainEngine(tiny_qwen2(0), TrainSettings(lr=1e-3), device=CUDA)
    for a, b in zip(fsdp.sequence_logprobs(sequences), local.sequence_logprobs(sequences), strict=True):
        assert a.device.type == "cpu"
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    got = fsdp.train_step(sequences, prompt_lens, ppo_loss, copy.deepcopy(extra))
    want = local.train_step(sequences, prompt_lens, ppo_loss, copy.deepcopy(extra))
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5) and got["grad_norm"] == pytest.approx(
        want["grad_norm"], rel=1e-4)
    assert_same_step(fsdp.state_dict(), local.state_dict(), lr=1e-3)
    torch.distributed.destroy_process_group()


def test_the_fsdp_engine_on_nccl_steps_like_the_torch_engine():
    sequences, prompt_lens = _batch(2)
    extra = {"behav_logp": [torch.full((len(s) - p,), -4.0) for s, p in zip(sequences, prompt_lens)],
             "prox_logp": [torch.full((len(s) - p,), -4.1) for s, p in zip(sequences, prompt_lens)],
             "advantage": torch.tensor([0.5, -1.0, 1.0, -0.25])}
    run_spawned(_fsdp_matches_torch_on_nccl, (sequences, prompt_lens, extra), nprocs=1, timeout_s=180,
                what="a one-rank NCCL FSDP trainer")


def _nccl_member(member: int, rendezvous: str) -> None:
    from areal.engines.weight_group import WeightGroup

    group = WeightGroup(rendezvous, member, 2, device="cuda", timeout_s=60)
    if member == 0:
        group.send({"w": torch.ones(4, device=CUDA)})
    else:
        group.receive()


def test_nccl_refuses_two_weights_group_members_on_one_gpu():
    """Why a local run may not broadcast over NCCL (config: _nccl_weights_need_a_gpu_each): measured on an H200,
    the group fails with 'Duplicate GPU detected' when trainer and generator share the GPU."""
    from tests.spawned import free_port

    if torch.cuda.device_count() > 1:
        pytest.skip("both members would take the first GPU only where there is one")
    with pytest.raises(Exception, match="Duplicate GPU detected"):
        run_spawned(_nccl_member, (f"127.0.0.1:{free_port()}",), nprocs=2, timeout_s=120,
                    what="two NCCL weights-group members on one GPU")


def test_the_fixed_step_in_cuda_graphs_draws_what_it_draws_eager_and_what_todays_engine_draws():
    """The decode step replayed from CUDA graphs at the ladder's sizes (padded rows, the whole cache width) gives the
    eager step's tokens and log-probs, and both today's, through refills and a weight update (float32 on CUDA)."""
    from areal.engines.decode import SlotGenerationEngine

    old, new = tiny_qwen2(0), tiny_qwen2(1)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(1, 100, (int(n),), generator=g).tolist() for n in torch.randint(2, 12, (6,), generator=g)]
    requests = [GenRequest(i, prompts[i // 4], 3 + (7 * i) % 20) for i in range(24)]
    runs = []
    for build in (lambda m: TorchGenerationEngine(m, eos_token_id=5, pad_token_id=0, max_batch=7, refill_min_free=2),
                  lambda m: SlotGenerationEngine(m, eos_token_id=5, pad_token_id=0, max_batch=7, refill_min_free=2),
                  lambda m: SlotGenerationEngine(m, eos_token_id=5, pad_token_id=0, max_batch=7, refill_min_free=2,
                                                 graphs=True)):
        engine = build(copy.deepcopy(old).to(CUDA))
        engine.submit(requests)
        done, steps = {}, 0
        while engine.pending():
            done |= {r.request_id: r for r in engine.step()}
            steps += 1
            if steps == 6:
                engine.update_weights(new.state_dict(), version=1)
        runs.append(done)
    assert runs[2] and engine._step.captured >= 2
    for other in runs[1:]:
        for i, r in runs[0].items():
            assert other[i].output_ids.tolist() == r.output_ids.tolist() and other[i].versions.tolist() == (
                r.versions.tolist())
            torch.testing.assert_close(other[i].logprobs, r.logprobs, atol=1e-4, rtol=1e-4)

"""Data-parallel training over torch.distributed with FSDP2 (`fully_shard`): many ranks, one step.

Every rank is given the whole batch (the same sequences, in the same order) and takes its share:
`balance_across_ranks` deals the sequences so each rank holds about the same number of tokens, and
each share is packed into micro-batches under the token budget as in `TorchTrainEngine`.

The one idea is the weighting. A micro-batch's loss is a mean over its n_mb output tokens; it is
scaled by n_mb / N, N = output tokens of the *whole* batch over all ranks (known locally: every
rank sees every length), and by the world size W, because FSDP's reduce-scatter averages the
ranks' gradients. The sum over ranks of the scaled gradients is then the gradient of the
token-weighted mean over the batch: the step equals `TorchTrainEngine.train_step` on one process.

FSDP gathers each layer's parameters inside every forward, a collective, so all ranks must run
the same number of forwards: a rank with fewer micro-batches (or no sequences) runs padding
micro-batches, a real sequence whose loss is multiplied by 0. π_prox (`sequence_logprobs`) is
computed share by share and all-gathered as one flat float tensor (no pickling between ranks).

Checkpoints are `TorchTrainEngine`'s format, written by rank 0 from gathered weights and moments
(and read by every rank, each keeping its shard), so a run can resume on either engine.

Not here: starting the ranks (torchrun, Ray or the test's spawn does it and initialises the
process group; `join_process_group` joins it, or starts a one-rank group for a lone trainer),
tensor or pipeline parallelism, sharded checkpoints (torch.distributed.checkpoint) for models
too large to gather on one rank.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist
from torch import Tensor

from areal.engines.training.micro_batch import ExtraField, LossFn, MicroBatch
from areal.engines.training.step_stats import StepStats, Total
from areal.engines.training.torch_train import TorchTrainEngine, read_trainer_state, refuse_non_finite
from areal.engines.training.trainer_settings import TrainSettings, enter_update_mode
from areal.kernels.packing import balance_across_ranks, pack_microbatches
from areal.kernels.shared_prefix import members

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def join_process_group(device_type: str = "cuda") -> str:
    """Join the process group torchrun (or Ray) described in the environment, or start a one-rank one.

    Returns the device type the ranks train on: "cuda" (NCCL, one GPU per local rank) when `device_type` asks
    for it and there is a GPU, else "cpu" (gloo).
    """
    cuda = device_type == "cuda" and torch.cuda.is_available()
    if cuda:
        # a rank per GPU on one node; under Ray each rank sees only its own GPU, so it is device 0
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    if not dist.is_initialized():
        backend = "nccl" if cuda else "gloo"
        if "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend)  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return "cuda" if cuda else "cpu"


def rank_microbatches(lengths: Sequence[int], n_ranks: int, max_tokens: int) -> list[list[list[int]]]:
    """Per rank, its micro-batches (indices into the batch): token-balanced shares, then packed.

    Deterministic in the lengths, so every rank computes the same plan without talking.
    """
    shares = balance_across_ranks(lengths, n_ranks)
    plan = []
    for share in shares:
        packed = pack_microbatches([lengths[i] for i in share], max_tokens) if share else []
        plan.append([[share[j] for j in mb] for mb in packed])
    return plan


class FSDPTrainEngine:
    """The TrainEngine interface, data-parallel over the current process group; see the module doc."""

    def __init__(self, model: PreTrainedModel, settings: TrainSettings | None = None, *,
                 device: torch.device | None = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError(
                "FSDPTrainEngine: torch.distributed is not initialised in this process; start the ranks with "
                "torchrun (or Ray) and call torch.distributed.init_process_group first, or use TorchTrainEngine"
            )
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = device or torch.device("cpu")  # where this rank's shard and its collectives' tensors live
        mesh = init_device_mesh(self.device.type, (self.world,))
        # one FSDP unit per decoder layer, then the root (embeddings, norm, head): gathers overlap layer by layer
        for layer in _decoder_layers(model):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        # the local engine over the sharded model: its optimizer, lr schedule and packed forward
        self.local = TorchTrainEngine(model, settings)
        self.settings = self.local.settings
        self.model = model

    @property
    def step(self) -> int:
        return self.local.step

    # ---- forward passes -------------------------------------------------------------------------

    def sequence_logprobs(self, sequences: Sequence[Tensor], no_grad: bool = True) -> list[Tensor]:
        """log π_θ of tokens 1..L-1 of every sequence, on every rank; each rank computes its share."""
        self.model.eval()
        lengths = [len(s) for s in sequences]
        plan = rank_microbatches(lengths, self.world, self.settings.microbatch_tokens)
        steps = max(len(p) for p in plan)
        mine = plan[self.rank]
        local: dict[int, Tensor] = {}
        with torch.no_grad():
            for k in range(steps):
                units = self.local._units(sequences, mine[k] if k < len(mine) else [0])  # [0]: a padding forward
                index = members(units)  # keeps the collectives in step
                logp, _, cu = self.local._logprobs(sequences, [1] * len(sequences), units)
                if k < len(mine):
                    for j, i in enumerate(index):
                        local[i] = logp[int(cu[j]) : int(cu[j + 1])]
        # gather: rank r's values in its plan order, padded to the longest rank's count
        counts = [sum(lengths[i] - 1 for mb in p for i in mb) for p in plan]
        flat = torch.zeros(max(counts), dtype=torch.float64, device=self.device)  # NCCL moves only CUDA tensors
        order = [i for mb in mine for i in mb]
        if order:
            flat[: counts[self.rank]] = torch.cat([local[i] for i in order]).double()
        gathered = [torch.empty_like(flat) for _ in range(self.world)]
        dist.all_gather(gathered, flat)
        dtype = next(iter(local.values())).dtype if local else torch.float32
        out: list[Tensor] = [torch.empty(0)] * len(sequences)
        for r, p in enumerate(plan):
            at = 0
            for i in (i for mb in p for i in mb):
                out[i] = gathered[r][at : at + lengths[i] - 1].to("cpu", dtype)
                at += lengths[i] - 1
        return out

    # ---- training ---------------------------------------------------------------------------------

    def train_step(
        self,
        sequences: Sequence[Tensor],
        prompt_lens: Sequence[int],
        loss_fn: LossFn,
        extra: dict[str, ExtraField] | None = None,
        *,
        loss_reduction: Literal["mean", "sum"] = "mean",
        lr_step: int | None = None,
    ) -> dict[str, float]:
        """One optimizer step over the whole batch (the same on every rank); stats are global.

        `lr_step`: the lr schedule's position, as in `TorchTrainEngine.train_step`.
        """
        start = time.perf_counter()
        per_token, per_sample = self.local._check_batch(sequences, prompt_lens, extra or {})
        out_lens = [len(s) - p for s, p in zip(sequences, prompt_lens, strict=True)]
        total = sum(out_lens)
        plan = rank_microbatches([len(s) for s in sequences], self.world, self.settings.microbatch_tokens)
        steps = max(len(p) for p in plan)
        mine = plan[self.rank]
        enter_update_mode(self.model, self.settings)
        self.local.optimizer.zero_grad(set_to_none=True)
        numbers = StepStats()
        for k in range(steps):
            real = k < len(mine)
            units = self.local._units(sequences, mine[k] if real else [0])  # padding: a real sequence, weighted 0
            index = members(units)
            logp, entropy, cu = self.local._logprobs(sequences, prompt_lens, units, entropy=self.settings.token_entropy)
            mb = MicroBatch.gathered(index, cu, per_token, per_sample, entropy, total, logp.device)
            loss, stats = loss_fn(logp, mb)
            share = 1.0 / total if loss_reduction == "sum" else mb.n_tokens / total
            # × W: FSDP's reduce-scatter averages the ranks' gradients, and we want their sum
            (loss * (share * self.world if real else 0.0)).backward()
            loss_mean = loss.detach() * (1.0 / mb.n_tokens if loss_reduction == "sum" else 1.0)
            numbers.add({"loss": float(loss_mean), **stats}, mb.n_tokens, counted=real)
        numbers.reduce(partial(self._reduced, dist.ReduceOp.SUM), partial(self._reduced, dist.ReduceOp.MAX))
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.grad_clip or math.inf)
        # the reduced loss and the full norm are the same on every rank: all refuse together or none
        result = numbers.result()
        refuse_non_finite(result["loss"], float(_full(grad_norm)), self.local.step, self.local.optimizer)
        lr = self.settings.lr_at(self.local.step if lr_step is None else lr_step)
        for group in self.local.optimizer.param_groups:
            group["lr"] = lr
        self.local.optimizer.step()
        self.local.step += 1
        result |= {
            "grad_norm": float(_full(grad_norm)),
            "lr": lr,
            "tokens": Total(total),
            "sequences": Total(len(sequences)),
            "microbatches": Total(sum(len(p) for p in plan)),
            "time_s": Total(time.perf_counter() - start),
        }
        return result

    def _reduced(self, op: Any, values: list[float]) -> list[float]:
        """`values` combined over the ranks by `op` (every rank passes the same count)."""
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=op)
        return tensor.tolist()

    # ---- weights ----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Tensor]:
        """The full (unsharded) weights on every rank, on CPU: a collective, every rank must call it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        return {name: value for name, value in full.items() if isinstance(value, Tensor)}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load full weights (the same on every rank) into the shards: a collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        # a tied head written once (save_pretrained drops the alias) is set through the parameter it shares
        set_model_state_dict(self.model, dict(state_dict), options=StateDictOptions(full_state_dict=True))

    def save(self, directory: str | Path, version: int) -> None:
        """`TorchTrainEngine.save`'s checkpoint, of the full weights and moments: a collective, rank 0 writes."""
        # gather in the optimizer's order, the same on every rank: each full_tensor is a collective
        moments = {key: _full(value) for key, value in self.local.optimizer_moments().items()}
        weights = self.state_dict()
        if self.rank == 0:
            self.local.write_checkpoint(directory, moments, version=version, model_state=weights)
        dist.barrier()  # no rank reads the checkpoint before it is whole

    def load(self, directory: str | Path) -> int:
        """Restore a checkpoint of either engine; every rank reads it and keeps its shard: a collective.

        Returns the policy version it recorded."""
        from safetensors.torch import load_file

        directory = Path(directory)
        scalars = read_trainer_state(directory)
        self.load_state_dict(load_file(str(directory / "model" / "model.safetensors")))
        params = dict(self.local._named_params)
        moments = {key: _placed_like(params.get(key.rpartition("::")[0]), value)
                   for key, value in load_file(str(directory / "optimizer.safetensors")).items()}
        self.local.load_training_state(directory, moments, scalars)
        return int(scalars["version"])


def _decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The repeated blocks of an HF causal LM (model.model.layers), or none for other modules."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    return list(layers) if isinstance(layers, torch.nn.ModuleList) else []


def _full(t: Tensor) -> Tensor:
    """A DTensor's global value (clip_grad_norm_ over sharded grads returns one); a tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _placed_like(param: Any, value: Tensor) -> Tensor:
    """A full moment as its sharded parameter holds it (a DTensor of the same placements); others as they are."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(param, DTensor) and value.shape == param.shape:
        return distribute_tensor(value.to(param.device), param.device_mesh, param.placements)
    return value  # Adam's step count, or a parameter FSDP left whole

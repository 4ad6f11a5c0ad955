"""Training on an emulated device: the TrainEngine Protocol in modelled time, with no model.

`trainer.engine=emulated` swaps this in behind the trainer and compute-logprob nodes. A proximal
pass over N tokens costs `logprob_step_s + logprob_per_token_s·N`, an update
`train_step_s + train_per_token_s·N`, publishing a version `weights_publish_s` (DeviceProfile).
The PPO loss still runs, once per update over the rank's share of the batch, on the emulated log-probabilities
(`token_logprobs`, equal for π_behav, π_prox and π_θ), so its statistics are real numbers; no
gradient is taken and the "weights" are one counter, the optimizer steps taken.

Data-parallel ranks (`trainer.ranks`, each its own process, as with FSDP): the ranks join a gloo
group, each charges the tokens of its share of the batch (`balance_across_ranks`, as the FSDP engine
deals them) divided by `emulation.trainer_gpus_per_rank`, and they meet in an all-reduce after every
update, so a step lasts as long as its slowest rank, as with a real gradient reduction.

Checkpoints hold the step and the version (JSON), so a resumed run continues where it stopped.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from areal.engines.emulated.device import DeviceProfile, ModelledClock, token_logprobs
from areal.engines.training.micro_batch import LossFn, MicroBatch
from areal.engines.training.step_stats import Total, kinds_kept
from areal.kernels.packing import balance_across_ranks

CHECKPOINT_FORMAT = "emulated-1"


class EmulatedTrainEngine:
    """The TrainEngine Protocol on modelled devices; see the module doc."""

    def __init__(self, profile: DeviceProfile, *, time_scale: float, gpus_per_rank: int = 1,
                 ranks: int = 1) -> None:
        self.profile = profile
        self.clock = ModelledClock(time_scale)
        self.gpus_per_rank = gpus_per_rank
        self.rank, self.world = 0, 1
        if ranks > 1:
            import torch.distributed as dist

            from areal.engines.training.fsdp_train import join_process_group

            # no model on a device: gloo; the trainer's rank orders (runtime/worker/ranks.py) travel in this group too
            join_process_group("cpu")
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.step = 0  # "optimizer steps" taken; the policy version is the trainer node's
        self.modelled_s = {"logprob": 0.0, "train": 0.0, "weights": 0.0}

    def sequence_logprobs(self, sequences: Sequence[Tensor], no_grad: bool = True) -> list[Tensor]:
        """log π of tokens 1..L-1 of each sequence (prompt included), after the modelled forward pass."""
        self._spend("logprob", self.profile.logprob_s(self._my_tokens([len(s) for s in sequences])))
        self._meet()
        lengths = [len(s) - 1 for s in sequences]
        if not sequences:
            return []
        tokens = torch.cat([torch.as_tensor(s)[1:] for s in sequences])
        positions = torch.cat([torch.arange(1, n + 1) for n in lengths])
        return list(token_logprobs(tokens, positions).split(lengths))  # one pass over the batch, not one a row

    def train_step(self, sequences: Sequence[Tensor], prompt_lens: Sequence[int], loss_fn: LossFn,
                   extra: dict | None = None, *, loss_reduction: Literal["mean", "sum"] = "mean",
                   lr_step: int | None = None) -> dict[str, float]:
        """One modelled update over the batch; the loss runs once over all of it (no gradient)."""
        if len(sequences) != len(prompt_lens) or not sequences:
            raise ValueError(f"train_step: need one prompt_len per sequence and at least one sequence, "
                             f"got {len(sequences)} sequences and {len(prompt_lens)} prompt_lens")
        lengths_all = [len(s) for s in sequences]
        # this rank's share, as FSDP deals it; the loss of the others' shares is theirs to compute
        mine = self._share(lengths_all)
        outputs = [torch.as_tensor(sequences[i])[prompt_lens[i]:] for i in mine]
        prompts = [prompt_lens[i] for i in mine]
        lengths = torch.tensor([len(o) for o in outputs], dtype=torch.int64)
        cu = torch.zeros(len(outputs) + 1, dtype=torch.int64)
        cu[1:] = lengths.cumsum(0)
        positions = torch.cat([torch.arange(p, p + len(o)) for o, p in zip(outputs, prompts)] or [torch.zeros(0)])
        logp = token_logprobs(torch.cat(outputs or [torch.zeros(0)]), positions)
        fields: dict[str, Tensor] = {}
        for name, value in (extra or {}).items():  # a Tensor is per sample, a list of rows per token
            fields[name] = value[mine] if isinstance(value, Tensor) else torch.cat(
                [torch.as_tensor(value[i]) for i in mine] or [torch.zeros(0)])
        total = sum(n - p for n, p in zip(lengths_all, prompt_lens))
        mb = MicroBatch(index=mine, cu_seqlens=cu, fields=fields, batch_tokens=total)
        loss, stats = loss_fn(logp, mb) if mine else (torch.zeros(()), {})
        if loss_reduction == "sum" and mine:  # reported as the mean over tokens, as the torch engine reports it
            loss = loss / max(int(lengths.sum()), 1)
        cost = self.profile.train_s(sum(lengths_all[i] for i in mine) / self.gpus_per_rank)
        if self.world * self.gpus_per_rank > 1:
            cost += self.profile.train_sync_s
        self._spend("train", cost)
        self._meet()
        self.step += 1
        return {"loss": float(loss), **{k: kinds_kept(v) for k, v in stats.items()}, "tokens": Total(total),
                "sequences": Total(len(sequences)), "modelled_s": Total(cost)}

    def _share(self, lengths: list[int]) -> list[int]:
        """The sequences this rank computes: its token-balanced share of the batch (all of it on one rank)."""
        return balance_across_ranks(lengths, self.world)[self.rank] if self.world > 1 else list(range(len(lengths)))

    def _my_tokens(self, lengths: list[int]) -> float:
        """Tokens this rank computes, spread over the GPUs a rank stands for."""
        return sum(lengths[i] for i in self._share(lengths)) / self.gpus_per_rank

    def _meet(self) -> None:
        """Ranks wait for each other, as a gradient reduction or an all-gather makes them."""
        if self.world > 1:
            import torch.distributed as dist

            dist.all_reduce(torch.zeros(1))

    def _spend(self, kind: str, seconds: float) -> None:
        self.modelled_s[kind] += seconds
        self.clock.spend(seconds)

    # -- weights and checkpoints -------------------------------------------------------------

    def state_dict(self) -> dict[str, Tensor]:
        """The "weights": the step counter; gathering and sending a real model's costs `weights_publish_s`."""
        self._spend("weights", self.profile.weights_publish_s)
        return {"emulated.step": torch.tensor([self.step], dtype=torch.int64)}

    def load_state_dict(self, state_dict: dict[str, Tensor]) -> None:
        self.step = int(state_dict["emulated.step"][0])

    def save(self, directory: str | Path, version: int) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {"format": CHECKPOINT_FORMAT, "step": self.step, "version": version}
        (directory / "trainer_state.json").write_text(json.dumps(state))

    def load(self, directory: str | Path) -> int:
        path = Path(directory) / "trainer_state.json"
        state: dict[str, Any] = json.loads(path.read_text())
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path}: checkpoint format {state.get('format')!r}; trainer.engine=emulated reads "
                             f"{CHECKPOINT_FORMAT!r} (a checkpoint of a real engine cannot resume an emulated one)")
        self.step = int(state["step"])
        return int(state["version"])

"""What a training engine's `loss_fn` sees of one micro-batch, and a forward kept for the next update.

Shared by the torch and FSDP engines (and the emulated one): `MicroBatch` is their contract with a loss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Union

import torch
from torch import Tensor

from areal.kernels.shared_prefix import Unit, members

ExtraField = Union[Sequence[Tensor], Tensor]  # noqa: UP007 (a runtime alias: `|` fails on py3.10 generics)
LossFn = Callable[[Tensor, "MicroBatch"], tuple[Tensor, dict[str, Union[float, Tensor]]]]  # noqa: UP007


@dataclass(frozen=True)
class MicroBatch:
    """What `loss_fn` sees of one micro-batch, aligned with its packed `logp` [N_mb].

    Per-token extras (given as a list of per-sample tensors, or a Ragged) arrive packed in the
    same order as logp: `mb["advantage"]` is [N_mb]. Per-sample extras (given as a Tensor whose
    first dim is S) arrive as [s], one row per sample of this micro-batch;
    `mb.per_token(mb["reward"])` spreads one onto the tokens. With `TrainSettings.token_entropy`,
    `mb["entropy"]` [N_mb] is the entropy of π_θ (at the settings' temperature) at each output token, with its
    gradient.
    """

    index: list[int]  # positions in the batch of this micro-batch's samples, in packed order
    cu_seqlens: Tensor  # [s+1] int64: sample j owns logp[cu_seqlens[j]:cu_seqlens[j+1]]
    fields: dict[str, Tensor]
    batch_tokens: int  # output tokens in the whole batch (N of the token-weighted mean)

    @classmethod
    def gathered(cls, index: list[int], cu_seqlens: Tensor, per_token: dict[str, list[Tensor]],
                 per_sample: dict[str, Tensor], entropy: Tensor | None, batch_tokens: int,
                 device: torch.device) -> MicroBatch:
        """The micro-batch of batch rows `index`: their per-token extras packed, the forward's entropy where it
        gave one, their per-sample extras taken; on `device`."""
        fields = {k: torch.cat([rows[i] for i in index]).to(device) for k, rows in per_token.items()}
        fields |= {} if entropy is None else {"entropy": entropy}
        fields |= {k: v[index].to(device) for k, v in per_sample.items()}
        return cls(index=list(index), cu_seqlens=cu_seqlens, fields=fields, batch_tokens=batch_tokens)

    def __getitem__(self, name: str) -> Tensor:
        return self.fields[name]

    @property
    def n_tokens(self) -> int:
        return int(self.cu_seqlens[-1])

    def per_token(self, per_sample: Tensor) -> Tensor:
        """[s, ...] -> [N_mb, ...]: each sample's value repeated over its output tokens."""
        counts = (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).to(per_sample.device)
        return torch.repeat_interleave(per_sample, counts, dim=0)


@dataclass(frozen=True)
class KeptForward:
    """A `sequence_logprobs` forward kept with its graph: log π_θ of tokens 1..L-1 per micro-batch (its rows, logp,
    the entropy when the update takes it, cu_seqlens), valid for a train_step over the same sequences at the same
    optimizer step."""

    step: int
    sequences: list[Tensor]
    parts: list[tuple[list[Unit], Tensor, Tensor | None, Tensor]]

    def serves(self, step: int, sequences: Sequence[Tensor]) -> bool:
        """Whether a train_step over `sequences` at `step` may backpropagate through this forward."""
        return step == self.step and len(sequences) == len(self.sequences) and all(
            a is b or torch.equal(torch.as_tensor(a), torch.as_tensor(b))
            for a, b in zip(sequences, self.sequences, strict=True))

    def output_logprobs(self, n: int, prompt_lens: Sequence[int]) -> tuple[Tensor, Tensor | None, Tensor]:
        """Micro-batch n's log-probs (and entropies) of the output tokens only (positions >= prompt_len), and their
        cu_seqlens."""
        units, logp, entropy, cu = self.parts[n]
        index = members(units)
        starts = [int(cu[j]) + prompt_lens[i] - 1 for j, i in enumerate(index)]
        ends = [int(cu[j + 1]) for j in range(len(index))]
        counts = torch.tensor([e - s for s, e in zip(starts, ends, strict=True)], dtype=torch.int64)
        out_cu = torch.zeros(len(index) + 1, dtype=torch.int64)
        out_cu[1:] = counts.cumsum(0)
        spans = list(zip(starts, ends, strict=True))
        return (torch.cat([logp[s:e] for s, e in spans]),
                None if entropy is None else torch.cat([entropy[s:e] for s, e in spans]), out_cu)

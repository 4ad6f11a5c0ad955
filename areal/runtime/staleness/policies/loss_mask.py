"""The loss mask a trainer's update reads, on the packed output tokens of its view (port names): an episode's
own (its tool and environment tokens are 0), with the run's choices laid on top (a cut output, under
`trainer.truncated=mask`; a token older than η, under `staleness_policy=token`). Every rank of a trainer builds
the same mask from the same view, and the staleness check reads the mask the loss reads.
"""

from __future__ import annotations

import torch

from areal.errors import RunError
from areal.graph.batch import Batch, Ragged


def loss_mask(view: Batch) -> torch.Tensor:
    """[N] bool, packed like the versions: the mask the view brings, or every output token."""
    versions = view["versions"]
    if "loss_mask" not in view:
        return torch.ones(len(versions.values), dtype=torch.bool)
    mask = view["loss_mask"]
    if not torch.equal(mask.offsets, versions.offsets):
        raise RunError("loss_mask and versions disagree on the output tokens of a sample: each needs one value "
                       "per output token")
    return mask.values.bool()


def with_mask(view: Batch, keep: torch.Tensor) -> tuple[Batch, int]:
    """The view with loss mask 0 wherever `keep` ([N] bool, packed like the versions) is False, and how many
    tokens the view had in its loss that this took out."""
    own = loss_mask(view)
    removed = int((own & ~keep).sum())
    return view.merge({"loss_mask": Ragged((own & keep).to(torch.int32), view["versions"].offsets)}), removed


def with_truncated_masked(view: Batch) -> tuple[Batch, int]:
    """The view with loss mask 0 on every token of an output cut at max_new_tokens (`truncated` = 1): its reward
    judged an answer that never ended (DAPO's overlong filtering). Returns how many samples were cut."""
    cut = view["truncated"].bool()  # one per sample: the batch and the port's type [S] see to it
    masked, _ = with_mask(view, ~torch.repeat_interleave(cut, view["versions"].lengths))
    return masked, int(cut.sum())

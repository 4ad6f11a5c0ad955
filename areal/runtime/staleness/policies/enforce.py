"""A trainer's side of its staleness policy: which arrived groups expired, the loss mask, and the check.

The worker calls these on what its update reads (the trainer node's view: port names, not the
qualified fields), so the check sees exactly the tokens and the mask the loss sees. Only the
trainer of the sampled policy enforces: its version is the one the tokens' versions count in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from areal.errors import RunError
from areal.graph.batch import Batch, Ragged
from areal.graph.meta import GroupMeta
from areal.runtime.staleness.policies.loss_mask import loss_mask, with_mask
from areal.runtime.staleness.policies.policy import Policy, TrainedStep


def expired(versions: Ragged, version: int, staleness: int) -> bool:
    """A group holding a token sampled before version - η: trained at `version` or later, it would break η."""
    return bool(len(versions.values)) and int(versions.values.min()) < version - staleness


def with_policy_mask(view: Batch, step: int, staleness: int) -> tuple[Batch, int]:
    """The view with loss mask 0 on every output token more than η versions behind `step` (the mask it brought
    kept beside it), and how many tokens that took out of the loss. On the packed tokens, in one pass."""
    return with_mask(view, view["versions"].values >= step - staleness)


def checked_step(policy: Policy, view: Batch, step: int, staleness: int, batch_size: int,
                 groups: Sequence[GroupMeta]) -> dict[str, Any]:
    """Re-check `policy`'s guarantee on the view the update reads; RunError names the broken promise. Returns the
    step's staleness numbers: the lag histogram of its samples and its trained tokens older than η."""
    trained = TrainedStep(step, staleness, batch_size, view["versions"], loss_mask(view), view["group_id"].tolist(),
                          list(groups))
    broken = policy.check(trained)
    if broken is not None:
        raise RunError(f"staleness bound broken at version {step} (staleness_policy={policy.name}): {broken}")
    return {"staleness": dict(trained.histogram()), "stale_tokens": trained.stale_trained_tokens()}

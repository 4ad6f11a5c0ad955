"""recycle (slime's partial rollout): a late group is re-queued with what it generated and goes on on newer weights.

The trainer takes the B oldest finished groups. Each generator stamps a group with its version
when it starts it; when it takes version v, every group of its still generating that was stamped
before v - η is interrupted: its running samples leave their slots for the front of the engine's
queue, keeping their tokens, and the group is stamped v. Readmitted ahead of every newer request,
a sample re-prefills its prompt and output on the weights of then and samples on. So no group
generates more than η versions past its stamp: each trained sample's newest token is at most η
versions newer than its group's last stamp. The re-queues are counted (`recycled` groups,
`recycled_tokens` carried over); a recycled group stays in flight until it is trained, so the
accounting identity is unchanged. (At the back of a full queue, a re-queued group waited while its
tokens aged: docs/benchmarks.md measures the price.)

Its older tokens, by `recycle_keep_prefix`:
- masked (the default, slime's `--mask-offpolicy-in-partial-rollout`): loss mask 0 on every token
  sampled more than η versions before the step, as `token` does. Guarantee: every trained token is
  at most η versions behind. Price: the masked tokens.
- kept: trained as sampled. Guarantee: only admission's (the gate, and no token older than the
  group's admission) and the stamp's; a trained token's lag has no bound, and every step records
  it (`stale_tokens`, the lag histogram).

Checked on every trained sample, from the token versions and its group's stamp: newest token <=
stamp + η; then, masked, token's check, and kept, admission's.
"""

from __future__ import annotations

import torch

from areal.runtime.staleness.policies.admission import admitted_within
from areal.runtime.staleness.policies.policy import Check, Policy, TrainedStep
from areal.runtime.staleness.policies.token import every_token_within


def stamped_within(step: TrainedStep) -> str | None:
    """None when no trained sample holds a token more than η versions newer than its group's last stamp."""
    stamps = {meta.group: meta.stamped_at for meta in step.groups}
    missing = next((g for g in step.group_ids if stamps.get(g) is None), None)
    if missing is not None:
        return f"a sample of group {missing} came with no generator's stamp (staleness_policy=recycle)"
    stamp = torch.tensor([stamps[g] for g in step.group_ids], dtype=torch.int64)
    late = (step.newest > stamp + step.staleness).nonzero()
    if len(late):
        row = int(late[0])
        return (f"a sample of group {step.group_ids[row]} holds a token of version {int(step.newest[row])}, more "
                f"than η={step.staleness} after its group's last stamp at version {int(stamp[row])}: it was not "
                "re-queued")
    return None


def both(first: Check, second: Check) -> Check:
    """The first broken promise of two checks."""
    return lambda step: first(step) or second(step)


POLICY = Policy("recycle", "every trained token ≤ {versions} behind; late groups re-queued with their output, "
                "older tokens masked", both(stamped_within, every_token_within), masks=True, recycles=True)
KEEPING = Policy("recycle", "late groups re-queued with their output and trained whole: trained lag unbounded "
                 "(measured); each group's newest token ≤ {versions} after its last re-queue",
                 both(stamped_within, admitted_within), recycles=True)

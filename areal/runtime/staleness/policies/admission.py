"""admission (AReaL's rule): η bounds when a group may start, not how old it is when trained.

The gate is strict's: a group starts only while floor(slot / B) <= i + η, its slot being its rank
among the groups holding one (AReaL's Eq. 3, `max_head_offpolicyness`). The trainer takes the B
oldest *finished* groups, so a straggler never holds a step back, and it is trained late, past η,
and kept: the lag of trained samples has no bound, and every step records its true distribution
(the step record's staleness histogram and `stale_tokens`).

Checked on every trained group, from its admission record: floor(slot / B) <= admitted_at + η, and
no token of its samples was sampled by a version older than the one it was admitted at.
"""

from __future__ import annotations

import torch

from areal.runtime.staleness.policies.policy import Policy, TrainedStep


def admitted_within(step: TrainedStep) -> str | None:
    """None when every trained group was admitted inside the gate and sampled no older than its admission."""
    for meta in step.groups:
        if meta.slot is None or meta.slot // step.batch_size > meta.admitted_at + step.staleness:
            return (f"group {meta.group} was admitted at version {meta.admitted_at} into slot {meta.slot}, past the "
                    f"gate's (version + η + 1)·B = {(meta.admitted_at + step.staleness + 1) * step.batch_size}")
    admitted = {meta.group: meta.admitted_at for meta in step.groups}
    missing = next((g for g in step.group_ids if g not in admitted), None)
    if missing is not None:
        return f"a sample of group {missing} came with no admission record"
    floor = torch.tensor([admitted[g] for g in step.group_ids], dtype=torch.int64)
    early = (step.oldest < floor).nonzero()
    if len(early):
        row = int(early[0])
        return (f"a sample of group {step.group_ids[row]} holds a token of version {int(step.oldest[row])}, older "
                f"than its admission at version {int(floor[row])}")
    return None

POLICY = Policy("admission", "trained lag unbounded (measured)", admitted_within)

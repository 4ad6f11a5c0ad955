"""strict: no trained sample is more than η versions behind, and groups train in admission order.

The gate lets a group start while floor((N - 1) / B) <= i + η (N counts it among the groups that
hold a slot, i is the slowest trainer's version) and the trainer takes groups in that order, B per
step, so the group ranked N - 1 is trained at version floor((N - 1) / B) <= i_start + η: every
token of every trained sample was sampled at most η versions before its step. The price: a step
waits for every group of its batch, so one long output holds up B·G samples.

Checked on every trained sample: step - min(versions) <= η.
"""

from __future__ import annotations

from areal.runtime.staleness.policies.policy import Policy, TrainedStep


def every_sample_within(step: TrainedStep) -> str | None:
    """None when no trained sample's oldest token is more than η versions behind the step."""
    lags = step.histogram()
    if any(lag > step.staleness for lag in lags):
        return f"lags {dict(sorted(lags.items()))} exceed η={step.staleness}"
    return None


POLICY = Policy("strict", "every trained sample ≤ {versions} behind", every_sample_within,
                in_order=True)

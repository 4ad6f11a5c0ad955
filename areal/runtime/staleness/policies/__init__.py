"""Staleness policies: what η bounds, and what a group that cannot be trained in time costs.

Every policy keeps the gate (staleness/gate.py): a group starts only while fewer than (i + η + 1)·B
groups hold a slot. They differ in what the trainer and the generators do with a group that
finishes late; each is one module, its guarantee in its docstring, and one row of `POLICIES`,
named by `RunConfig.staleness_policy` (recycle's flag, `recycle_keep_prefix`, picks its other row:
`policy_named`). docs/design-notes.md compares them, with their measured price.

May import: areal.graph (and the leaves areal.config, areal.overrides, areal.errors).
"""

from __future__ import annotations

from areal.runtime.staleness.policies import admission, drop, recycle, strict, token
from areal.runtime.staleness.policies.policy import Policy, TrainedStep

POLICIES: dict[str, Policy] = {p.name: p for p in (strict.POLICY, admission.POLICY, drop.POLICY, token.POLICY,
                                                    recycle.POLICY)}


def policy_named(name: str, recycle_keep_prefix: bool = False) -> Policy:
    """The table's row; recycle with `recycle_keep_prefix` trains its re-queued groups' older tokens unmasked."""
    return recycle.KEEPING if name == "recycle" and recycle_keep_prefix else POLICIES[name]


__all__ = ["POLICIES", "Policy", "TrainedStep", "policy_named"]

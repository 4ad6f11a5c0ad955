"""token (AReaL PR 1722, xtuner's `max_token_staleness`): no trained *token* is more than η versions behind.

The trainer takes the B oldest finished groups, as admission does, and gives loss mask 0 to every
output token sampled more than η versions before the step (beside the mask an episode already
has). A straggler is kept and its fresh tokens are learned from; its old ones are counted
`masked_tokens` and read by no loss. The price: those tokens, generated and not learned from.

Checked on every trained token: no token the loss reads was sampled before version step - η.
"""

from __future__ import annotations

from areal.runtime.staleness.policies.policy import Policy, TrainedStep, versions


def every_token_within(step: TrainedStep) -> str | None:
    """None when no token with loss mask 1 is more than η versions behind the step."""
    stale = step.stale_trained_tokens()
    if stale:
        tokens, are = ("1 token", "is") if stale == 1 else (f"{stale} tokens", "are")
        return f"{tokens} the loss reads {are} more than η = {versions(step.staleness)} behind"
    return None


POLICY = Policy("token", "every trained token ≤ {versions} behind; older ones masked", every_token_within,
                masks=True)

"""drop (verl's `drop`, TRL, PRIME-RL, ROLL): no trained sample is more than η versions behind; late groups go.

The trainer takes the B oldest finished groups. When version v is published, a group that holds a
token sampled before v - η can no longer be trained within η: a generator aborts it where it is
(its samples stop decoding), and a trainer drops it if it has arrived. Either way its samples are
counted `dropped` with the tokens they had generated (wasted), and its slot at the gate starts
another group. The price: those tokens, and a bias toward short outputs (long ones are the late ones).

Checked on every trained sample: step - min(versions) <= η (strict's check).
"""

from __future__ import annotations

from areal.runtime.staleness.policies.policy import Policy
from areal.runtime.staleness.policies.strict import every_sample_within

POLICY = Policy("drop", "every trained sample ≤ {versions} behind; late groups dropped", every_sample_within,
                drops=True)

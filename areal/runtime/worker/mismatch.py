"""The mismatch alarm: a generator that samples another policy than the version it stamps on its tokens.

A token sampled with version v and scored by the trainer's proximal pass with the same version v (lag 0) was
drawn from the very distribution the trainer computes: log π_behav = log π_prox up to the numerics of two
forward passes (a KV-cached batched decode against one padded forward). A generator that missed a weight update,
loaded an adapter under the wrong name or never got the adapter at all (the silent failure of LoRA RL elsewhere:
"the rollout policy never actually changes") stamps version v on tokens of another policy, and the gap is then the
size of a policy step, far above the numerics. So every step the policy's trainer takes the largest gap at lag 0 per
generator and stops the run past `trainer.lag0_tolerance`, naming the generator, the version and the gap.

What it needs: a real proximal pass (objective=decoupled, the default: `standard` passes π_behav through, and a
trainer of one's own may read none), and tokens at lag 0 in the step (`lag0_tokens` counts them: a run whose
trainer is far behind its generators has few). Under `generation.on_new_weights=keep-kv` a row decodes on over KV
the old weights wrote, so only samples drawn wholly at v are compared. Tokens out of an episode's loss mask (tool
output) were never sampled and are left out.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from areal.config import RunConfig
from areal.errors import RunError
from areal.graph.batch import Batch
from areal.graph.node import Node

# The largest lag-0 gap measured over clean runs, with a margin (docs/metrics.md, "lag0_gap_max"): float32 on the
# CPU. bfloat16 was not measured (no GPU): its 8-bit mantissa puts a log-prob's rounding near 1e-2, so its default
# is set a decade above that, and the value for a given model and device is for the user to measure.
DEFAULT_TOLERANCE = {"float32": 5e-4, "bfloat16": 0.5}


def tolerance(config: RunConfig) -> float | None:
    """The gap past which the run stops: trainer.lag0_tolerance, else by dtype; None where the check is off
    (inf, or vLLM with top_p < 1, whose processed log-probs are renormalised over the nucleus)."""
    chosen = config.trainer.lag0_tolerance
    if chosen is None:
        if config.generation.engine == "vllm" and config.generation.top_p < 1:
            return None
        chosen = DEFAULT_TOLERANCE[config.dtype]
    return None if math.isinf(chosen) else chosen


def watched(config: RunConfig, pool_nodes: list[Node], binding: dict[str, str]) -> bool:
    """Whether the trainer reads a proximal pass of its own current weights (the alarm's other side)."""
    producer = binding.get("prox_logp", "").partition(".")[0]
    proximal = next((n for n in pool_nodes if n.name == producer), None)
    return (config.trainer.objective == "decoupled" and proximal is not None and proximal.kind == "compute-logprob"
            and not proximal.spec.params.get("frozen"))


def lag0_gaps(view: Batch, version: int, whole_samples: bool) -> tuple[Tensor, Tensor]:
    """|log π_behav − log π_prox| of each token sampled at `version`, and the group it belongs to; `whole_samples`:
    only samples whose every token is at `version` (keep-kv). Flat, in one pass: a step of 512 samples holds
    ~600k tokens, and only a run about to stop needs them by generator."""
    versions, behav, prox = view["versions"], view["behav_logp"], view["prox_logp"]
    row = versions.sample_index()
    at = versions.values == version
    if whole_samples:
        stale = torch.zeros(len(versions), dtype=torch.int64).index_add_(0, row, (~at).long()) > 0
        at &= ~stale[row]
    if "loss_mask" in view:  # an episode's tool and environment tokens were not sampled
        at &= view["loss_mask"].values.bool()
    chosen = at.nonzero().squeeze(1)
    gaps = (behav.values[chosen].double() - prox.values[chosen].double()).abs()
    return gaps, view["group_id"][row[chosen]]


def checked(view: Batch, version: int, generators: dict[int, str], whole_samples: bool,
            limit: float | None) -> dict[str, float]:
    """The step's numbers (lag0_gap_max, lag0_tokens, lag0_over); RunError naming the first generator past `limit`
    (`generators`: group id -> the generator that sampled it)."""
    gaps, groups = lag0_gaps(view, version, whole_samples)
    over = int((gaps > limit).sum()) if limit is not None else 0
    numbers = {"lag0_gap_max": float(gaps.max()) if len(gaps) else 0.0, "lag0_tokens": float(len(gaps)),
               "lag0_over": float(over)}
    if over:
        name, g = _worst(gaps, groups, generators)
        raise RunError(
            f"generator {name} is not sampling version {version}: {int((g > limit).sum())} of its {len(g)} tokens "
            f"stamped version {version} have log π_behav off the trainer's log π_prox of version {version} by up to "
            f"{float(g.max()):.3g} nats (trainer.lag0_tolerance={limit:g}); it samples with other weights than it "
            "says (a weight update it did not apply, or an adapter it did not load)")
    return numbers


def _worst(gaps: Tensor, groups: Tensor, generators: dict[int, str]) -> tuple[str, Tensor]:
    """The generator with the largest gap (the first in group order on a tie) and its gaps."""
    members: dict[str, list[int]] = {}
    for group in groups.unique().tolist():
        members.setdefault(generators.get(group, "a generator"), []).append(group)
    mine = {name: gaps[torch.isin(groups, torch.tensor(ids))] for name, ids in members.items()}
    return max(mine.items(), key=lambda item: float(item[1].max()))

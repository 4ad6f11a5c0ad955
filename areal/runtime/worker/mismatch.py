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
from typing import Any

import torch

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


def lag0_gaps(view: Batch, version: int, generators: dict[int, str], whole_samples: bool) -> dict[str, Any]:
    """Per generator: (largest |log π_behav − log π_prox| over its tokens sampled at `version`, their count, the
    gaps themselves). `generators`: group id -> the generator that sampled it; `whole_samples`: compare only samples
    whose every token is at `version` (keep-kv)."""
    versions, behav, prox = view["versions"], view["behav_logp"], view["prox_logp"]
    at = versions.values == version
    if whole_samples:
        row = versions.sample_index()
        stale = torch.zeros(len(versions.lengths), dtype=torch.int64).index_add_(0, row, (~at).long()) > 0
        at &= ~stale[row]
    if "loss_mask" in view:  # an episode's tool and environment tokens were not sampled
        at &= view["loss_mask"].values.bool()
    gap = (behav.values.double() - prox.values.double()).abs()
    owner = view["group_id"][versions.sample_index()]
    found: dict[str, Any] = {}
    for group in owner[at].unique().tolist():
        mine = at & (owner == group)
        name = generators.get(int(group), "a generator")
        g = gap[mine]
        previous = found.get(name)
        found[name] = g if previous is None else torch.cat([previous, g])
    return found


def checked(view: Batch, version: int, generators: dict[int, str], whole_samples: bool,
            limit: float | None) -> dict[str, float]:
    """The step's numbers (lag0_gap_max, lag0_tokens, lag0_over); RunError naming the first generator past `limit`."""
    gaps = lag0_gaps(view, version, generators, whole_samples)
    every = torch.cat(list(gaps.values())) if gaps else torch.zeros(0, dtype=torch.float64)
    over = int((every > limit).sum()) if limit is not None else 0
    numbers = {"lag0_gap_max": float(every.max()) if len(every) else 0.0, "lag0_tokens": float(len(every)),
               "lag0_over": float(over)}
    if over:
        name, g = max(gaps.items(), key=lambda item: float(item[1].max()))
        raise RunError(
            f"generator {name} is not sampling version {version}: {int((g > limit).sum())} of its {len(g)} tokens "
            f"stamped version {version} have log π_behav off the trainer's log π_prox of version {version} by up to "
            f"{float(g.max()):.3g} nats (trainer.lag0_tolerance={limit:g}); it samples with other weights than it "
            "says (a weight update it did not apply, or an adapter it did not load)")
    return numbers

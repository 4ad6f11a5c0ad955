"""The `ppo-update` node kind: consume B groups, step the optimizer, publish version + 1.

Its new weights travel on a control edge to every generate / compute-logprob node of its model,
so the data graph stays acyclic.
"""

from __future__ import annotations

from typing import Any

from areal.config import TrainerConfig
from areal.graph.node import NodeSpec
from areal.nodes import ports
from areal.nodes.settings import checked_settings


def ppo_update(name: str, *, token_advantages: bool = False, **settings: Any) -> NodeSpec:
    """Train the policy named `name` with (decoupled) PPO.

    `token_advantages=True` takes one advantage per output token (`Float["S", "T"]`, as GAE gives)
    instead of one per sample spread over its tokens. Other keyword arguments are this trainer's
    own settings, any field of RunConfig.trainer (`objective="standard"`, `lr=1e-5`,
    `clip_eps=0.1`): they win over the recipe's `trainer` section, and `--set
    nodes.NAME.FIELD=...` wins over them (areal/graph/settings.py).
    """
    return NodeSpec(
        "ppo-update",
        name,
        inputs={
            "prompt_ids": ports.PROMPT_IDS,
            "output_ids": ports.OUTPUT_IDS,
            "behav_logp": ports.BEHAV_LOGP,
            "prox_logp": ports.PROX_LOGP,
            "versions": ports.VERSIONS,
            "advantage": ports.TOKEN_ADVANTAGE if token_advantages else ports.ADVANTAGE,
            "loss_mask": ports.LOSS_MASK,
            "truncated": ports.TRUNCATED,
            "ref_logp": ports.REF_LOGP,
        },
        # loss_mask: produced by episodes (tool and environment tokens are not trained); truncated: by generate
        # nodes (trainer.truncated=mask reads it); ref_logp: by a frozen compute_logprob (trainer.kl_coef reads it)
        optional=frozenset({"loss_mask", "truncated", "ref_logp"}),
        outputs={},
        factory=_factory,
        doc="decoupled PPO over batches of B groups; publishes weights as version + 1",
        settings=checked_settings(TrainerConfig, settings, f"ppo_update({name!r})"),
        setting_paths={field: f"trainer.{field}" for field in TrainerConfig.model_fields},
    )


def _factory(**params: Any) -> Any:
    from areal.nodes.workers.trainer import TrainerNode

    return TrainerNode(**params)

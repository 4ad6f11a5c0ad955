"""Actor-critic nodes: a critic's values, GAE advantages and returns, and the critic's own trainer.

    g.add(compute_values("values", model="critic"), pool=1)   # values: V(s_t) per output token
    g.add(gae_advantage("gae", gamma=1.0, lam=0.95))          # advantage, returns per token
    g.add(ppo_update("actor", token_advantages=True))         # the policy, on per-token advantages
    g.add(value_update("critic"))                             # the critic, regressed on the returns

The critic is a model of its own (models/value.py), trained by `value_update` with its own
version counter and checkpoint part; `compute_values` follows its weights the way a generator
follows the policy's.
"""

from __future__ import annotations

from typing import Any

from areal.config import TrainerConfig
from areal.graph.node import NodeSpec
from areal.nodes import ports
from areal.nodes.settings import checked_settings


def compute_values(name: str, *, model: str) -> NodeSpec:
    """V(s_t) of each output token's state under the critic that trainer `model` trains (its newest weights)."""
    return NodeSpec(
        "custom",
        name,
        inputs={"prompt_ids": ports.PROMPT_IDS, "output_ids": ports.OUTPUT_IDS},
        outputs={"values": ports.VALUES},
        factory=_values,
        params={"model": model},
        doc=f"the critic '{model}''s value of each output token's state",
        role="map",
    )


def gae_advantage(name: str, *, gamma: float = 1.0, lam: float = 0.95, whiten: bool = True) -> NodeSpec:
    """Per-token advantages and returns by GAE(γ, λ), the sample's reward on its last token.

    `whiten` centres and scales the advantages over the batch's tokens (one prompt group), as PPO does.
    """
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gae_advantage({name!r}): gamma and lam must be in [0, 1], got {gamma} and {lam}")
    return NodeSpec(
        "custom",
        name,
        inputs={"reward": ports.REWARD, "values": ports.VALUES},
        outputs={"advantage": ports.TOKEN_ADVANTAGE, "returns": ports.RETURNS},
        factory=_gae,
        params={"gamma": gamma, "lam": lam, "whiten": whiten},
        doc=f"GAE advantages and returns (γ={gamma}, λ={lam})",
        role="map",
    )


def value_update(name: str, *, value_clip: float | None = 0.2, **settings: Any) -> NodeSpec:
    """Train the critic named `name`: each token's value regressed on its return, clipped to ±`value_clip`
    around the value it was scored with. Other keyword arguments are RunConfig.trainer fields, as for
    ppo_update (`lr=1e-4`)."""
    return NodeSpec(
        "custom",
        name,
        inputs={"prompt_ids": ports.PROMPT_IDS, "output_ids": ports.OUTPUT_IDS, "values": ports.VALUES,
                "returns": ports.RETURNS},
        outputs={},
        factory=_value_trainer,
        params={"value_clip": value_clip},
        doc="clipped value regression on the returns; publishes the critic as version + 1",
        settings=checked_settings(TrainerConfig, settings, f"value_update({name!r})"),
        setting_paths={field: f"trainer.{field}" for field in TrainerConfig.model_fields},
        role="trainer",
    )


def _values(**params: Any) -> Any:
    from areal.nodes.workers.critic import ValuesNode

    return ValuesNode(**params)


def _gae(**params: Any) -> Any:
    from areal.nodes.workers.critic import GAENode

    return GAENode(**params)


def _value_trainer(**params: Any) -> Any:
    from areal.nodes.workers.critic import ValueTrainerNode

    return ValueTrainerNode(**params)

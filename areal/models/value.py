"""A critic built from the policy: the same transformer, and a linear value head on every position.

The backbone starts as the policy's (the warm start already knows the task's text), the head at
zero, so every value starts at 0 and the first advantages are the returns themselves. It is a
Hugging Face token-classification model with one label, so `save_pretrained`, safetensors and
the training engine handle it like any other model.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def value_model(policy: PreTrainedModel) -> PreTrainedModel:
    """A critic with `policy`'s architecture and backbone weights, and a zeroed value head."""
    from transformers import AutoModelForTokenClassification

    config = copy.deepcopy(policy.config)
    config.num_labels = 1
    config.classifier_dropout = 0.0  # a value is regressed, not sampled: no dropout noise in its target
    critic = AutoModelForTokenClassification.from_config(config, dtype=policy.dtype)
    critic.base_model.load_state_dict(policy.base_model.state_dict())
    backbone = set(critic.base_model.modules())
    heads = [m for m in critic.modules() if isinstance(m, torch.nn.Linear) and m not in backbone]
    if not heads:
        raise ValueError(f"value_model: {type(critic).__name__} has no linear head outside its backbone")
    with torch.no_grad():
        for head in heads:
            head.weight.zero_()
            if head.bias is not None:
                head.bias.zero_()
    return critic

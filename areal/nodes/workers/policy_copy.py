"""A copy of the run's policy in a sampling worker: its generation engine, its tokenizer, and the way new
weights reach it.

The generate node and the episode runner both sample the policy the trainer publishes; what they share
is here: the engine `generation.engine` names on the run's checkpoint, started from the newest published
weights (a restarted worker) or the checkpoint's policy (a resumed run), and, with
transport.weights=broadcast, membership of the weights group (under vLLM the member is vLLM's own worker,
where the model is). What each does with the engine (groups of G completions, or episodes) is theirs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from areal.errors import ConfigError
from areal.nodes.workers.policy import first_file


class PolicyCopy:
    def __init__(self, context: Any) -> None:
        from areal.engines import generation_engine, needs_model, require_engines
        from areal.models.chat import uses_chat

        config = context.config
        require_engines(config, training=False)  # before loading anything: the error comes in seconds
        checkpoint: Any = None
        self.context_tokens: int | None = None
        if needs_model(config, generation=True):
            from areal.models.loading import checkpoint_dir, load_tokenizer

            checkpoint = checkpoint_dir(config.model)
            self.context_tokens = check_context(checkpoint, config.generation.max_new_tokens)  # before any cache
            self.tokenizer = load_tokenizer(checkpoint)
        else:  # an emulated device: no model and no tokenizer files, so no transformers in this process
            from areal.engines.emulated.device import ByteTokenizer

            self.tokenizer = ByteTokenizer()
        self.stops = list(config.generation.stop)
        self.chat = uses_chat(self.tokenizer, config.generation.chat_template)
        self.engine_name = config.generation.engine
        self.model_name = str(config.model)
        # the run's newest published weights (a restarted worker), else the checkpoint's (a resumed one)
        weights = first_file(context.published_weights(context.version), context.resumed_policy())
        self.engine = generation_engine(config, checkpoint, self.tokenizer, weights=weights, version=context.version,
                                        decode=self.decode)
        self.group: Any = None  # the weights group, when this process is the member
        if context.weights_group is not None:
            self._join_weights_group(*context.weights_group, version=context.version)

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def load_weights(self, weights: Mapping[str, Tensor], version: int) -> None:
        """Weights the trainer published (a file, shared memory); requests in flight continue on them."""
        self.engine.update_weights(dict(weights), version)

    def receive_weights(self, version: int) -> None:
        """Take part in the trainer's broadcast of `version`; in-flight requests continue on the new weights."""
        if self.group is None:
            self.engine.receive_weights(version)
        else:
            self.engine.update_weights(self.group.receive(), version)

    def _join_weights_group(self, rendezvous: str, member: int, size: int, version: int) -> None:
        if hasattr(self.engine, "join_weight_group"):  # vLLM: its worker process holds the model
            self.engine.join_weight_group(rendezvous, member, size)
        else:
            from areal.engines.weight_group import WeightGroup, group_device

            self.group = WeightGroup(rendezvous, member, size, device=group_device(self.engine_name))
        self.receive_weights(version)  # the trainer's weights as the group forms (its resumed ones, after a resume)


def check_context(checkpoint: Any, max_new_tokens: int) -> int | None:
    """The model's context in tokens (None when its config does not say); a ConfigError when it cannot hold a
    prompt and max_new_tokens, said now rather than when a cache sized by it exhausts memory."""
    from transformers import AutoConfig

    context = getattr(AutoConfig.from_pretrained(checkpoint, local_files_only=True), "max_position_embeddings", None)
    if context is not None and max_new_tokens >= context:
        raise ConfigError(f"generation.max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's "
                          f"context of {context} tokens (max_position_embeddings of {checkpoint}); "
                          f"set it below {context}")
    return int(context) if context is not None else None

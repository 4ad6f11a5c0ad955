"""A copy of the run's policy in a sampling worker: its generation engine, its tokenizer, and the way new
weights reach it.

The generate node and the episode runner both sample the policy the trainer publishes; what they share
is here: the engine `generation.engine` names on the run's checkpoint, started from the newest published
weights (a restarted worker) or the checkpoint's policy (a resumed run), and, with
transport.weights=broadcast, membership of the weights group (under vLLM the member is vLLM's own worker,
where the model is). What each does with the engine (groups of G completions, or episodes) is theirs.

A LoRA policy publishes its adapters alone (engines/lora/adapter.py): a torch engine gets them merged into a
working copy of the base weights they touch, as an ordinary full state dict, so it needs no LoRA layers; an engine
that serves adapters itself (vLLM's LoRA requests: `AdapterEngine`) gets the adapter as it came. A restarted or
resumed generator whose newest file is an adapter starts from the base and merges it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
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
        self.chat = uses_chat(self.tokenizer, config.generation.chat_template)
        self.stops = config.generation.stops(self.chat)
        self.engine_name = config.generation.engine
        self.model_name = str(config.model)
        # the run's newest published weights (a restarted worker), else the checkpoint's (a resumed one)
        weights = first_file(context.published_weights(context.version), context.resumed_policy())
        adapter = _adapter_in(weights)
        self.merger: Any = None  # LoRA: the working copy of the base weights the adapters touch
        self.engine = generation_engine(config, checkpoint, self.tokenizer, weights=None if adapter else weights,
                                        version=context.version, decode=self.decode,
                                        lora_rank=getattr(context, "lora_rank", 0))  # a worker's: the plan's
        if adapter is not None:
            self.deliver(self.engine, adapter, context.version)
        self.group: Any = None  # the weights group, when this process is the member
        if context.weights_group is not None:
            self._join_weights_group(*context.weights_group, version=context.version)

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def load_weights(self, weights: Mapping[str, Tensor], version: int) -> None:
        """Weights the trainer published (a file, shared memory); requests in flight continue on them."""
        self.deliver(self.engine, weights, version)

    def deliver(self, engine: Any, weights: Mapping[str, Tensor], version: int) -> None:
        """Give `engine` a published version: full weights as they are; a LoRA adapter merged into the base (or as it
        is, to an engine that serves adapters, or to one that holds no model in this process)."""
        from areal.engines import AdapterEngine
        from areal.engines.lora import Merger, is_adapter

        if not is_adapter(weights):
            engine.update_weights(dict(weights), version)
        elif isinstance(engine, AdapterEngine):
            engine.load_adapter(dict(weights), version)
        elif getattr(engine, "model", None) is None:  # an emulated device: it models the load, holds no weights
            engine.update_weights(dict(weights), version)
        else:
            if self.merger is None:  # the engine holds the base now: the copy is taken from it
                self.merger = Merger(engine.model.state_dict())
            engine.update_weights(self.merger.merged(weights), version)

    def receive_weights(self, version: int) -> None:
        """Take part in the trainer's broadcast of `version`; in-flight requests continue on the new weights."""
        if self.group is None:
            self.engine.receive_weights(version)
        else:
            self.deliver(self.engine, self.group.receive(), version)

    def _join_weights_group(self, rendezvous: str, member: int, size: int, version: int) -> None:
        if hasattr(self.engine, "join_weight_group"):  # vLLM: its worker process holds the model
            self.engine.join_weight_group(rendezvous, member, size)
        else:
            from areal.engines.weight_group import WeightGroup, group_device

            self.group = WeightGroup(rendezvous, member, size, device=group_device(self.engine_name))
        self.receive_weights(version)  # the trainer's weights as the group forms (its resumed ones, after a resume)


def _adapter_in(weights: Path | None) -> dict[str, Tensor] | None:
    """The adapter a weights file holds (a LoRA run's published or checkpointed policy); None for full weights."""
    from areal.engines.lora import adapter_file, read_adapter

    return read_adapter(weights) if weights is not None and adapter_file(weights) is not None else None


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

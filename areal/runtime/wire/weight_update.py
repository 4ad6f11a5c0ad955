"""A new version of a trained model's weights, and how it travels: the one thing a trainer publishes,
the controller's version table records and a follower is told to hold.

`via` names its transport (a key of `weights.TRANSPORTS`) and the transport's own address of the
version: a file, a shared-memory segment, or nothing (a broadcast carries the tensors itself), and what
the version's tensors are: the whole model (`full`), or a LoRA policy's adapters alone (`lora`: their
factors, engines/lora/adapter.py), which every transport carries as it carries full weights.
No `via` means the weights the follower was built with (version 0, or those a broadcast already
brought). Both are plain frozen dataclasses, so the control plane's messages carry them as msgpack maps.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Via:
    kind: str  # the transport: files, broadcast, shm
    where: str = ""  # its address of this version: a file path, a segment name; "" where it needs none
    weights: str = "full"  # what it carries: "full" (every tensor of the model) or "lora" (adapter factors only)


@dataclass(frozen=True)
class WeightUpdate:
    model: str  # the trainer node whose model has this version
    version: int
    via: Via | None = None  # None: the weights the follower holds already

    @property
    def adapter(self) -> bool:
        """Whether this version travels as a LoRA adapter's factors, not the model's weights."""
        return self.via is not None and self.via.weights == "lora"

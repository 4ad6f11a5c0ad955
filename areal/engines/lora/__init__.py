"""LoRA: adapters trained on the policy with peft (`training.py`), and what travels instead of the policy's weights,
the adapters' factors alone (`adapter.py`), merged into a working copy of the base where a generator samples.

Part of the engines layer: it imports peft (a core dependency) lazily, only where a LoRA policy is built or read.
"""

from areal.engines.lora.adapter import (
    KIND,
    Merger,
    adapter_file,
    factor_pairs,
    is_adapter,
    read_adapter,
    save_adapter,
    write_peft_dir,
)

__all__ = ["KIND", "Merger", "adapter_file", "factor_pairs", "is_adapter", "read_adapter", "save_adapter",
           "write_peft_dir"]

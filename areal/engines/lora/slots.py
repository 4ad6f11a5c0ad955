"""Adapters as vLLM LoRA requests: each version of a LoRA policy registered under an id of its own, and the newest
η + 1 kept registered, so a request resubmitted after an interruption always finds the version it is sent under.

vLLM serves an adapter from a PEFT directory named by a `LoRARequest(lora_name, lora_int_id, lora_path)`; its id must
be > 0 and, being the key of vLLM's adapter cache and of its prefix cache's blocks, new for new weights: version v is
id v + 1, written to its own directory. The engine starts with `enable_lora`, `max_loras` (adapters in one batch) and
`max_cpu_loras` (adapters kept loaded) both η + 1, and `max_lora_rank` the smallest rank vLLM accepts at or above the
policy's. Checked against vLLM's documented LoRA API (docs.vllm.ai, "LoRA Adapters"; vllm/v1/engine/llm_engine.py:
`add_lora(LoRARequest) -> bool`, `remove_lora(lora_id) -> bool`, `add_request(..., lora_request=...)`).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from areal.engines.lora.adapter import write_peft_dir

VLLM_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM's LoRAConfig accepts


def vllm_lora_args(rank: int, staleness: int) -> dict[str, Any]:
    """vLLM engine arguments for a LoRA policy of `rank` sampled up to η = `staleness` versions behind."""
    fits = [r for r in VLLM_RANKS if r >= rank]
    if not fits:
        raise ValueError(f"trainer.lora.rank={rank}: vLLM serves LoRA ranks up to {VLLM_RANKS[-1]}")
    versions = staleness + 1
    return {"enable_lora": True, "max_loras": versions, "max_cpu_loras": versions, "max_lora_rank": fits[0]}


class AdapterSlots:
    """The adapter versions registered with one vLLM engine: the newest `keep`, each a PEFT directory in `folder`."""

    def __init__(self, folder: Path, keep: int, base: str) -> None:
        self.folder, self.keep, self.base = Path(folder), max(1, keep), base
        self.held: dict[int, Path] = {}  # lora id -> its directory, oldest first

    def register(self, adapter: Mapping[str, Tensor], version: int) -> tuple[int, Path, list[int]]:
        """Write version `version`'s adapter; its id, its directory, and the ids now past the newest `keep` (the
        caller removes them from the engine; their directories are gone already)."""
        lora_id = version + 1
        path = write_peft_dir(adapter, self.folder / f"v{version:06d}", base=self.base)
        self.held[lora_id] = path
        retired = sorted(self.held)[:-self.keep]
        for old in retired:
            shutil.rmtree(self.held.pop(old), ignore_errors=True)
        return lora_id, path, retired

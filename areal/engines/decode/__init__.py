"""The decode step of fixed shape: a slot KV cache preallocated for max_batch rows (slots.py), a lean Qwen2/Llama
forward over it (lean.py), the step that runs it, draws and advances the slots, eager or from CUDA graphs (step.py),
and the engine that drives them behind the GenerationEngine Protocol (engine.py).

Part of the engines layer.
"""

from areal.engines.decode.engine import SlotGenerationEngine
from areal.engines.decode.lean import LeanForward, lean_problem

__all__ = ["LeanForward", "SlotGenerationEngine", "lean_problem"]

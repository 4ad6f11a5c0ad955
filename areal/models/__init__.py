"""The models areal ships and loads: the built-in tiny models and their tokenizer, local Hugging Face
checkpoints, GGUF files, and the warm start that teaches a built-in model its task's format.

May import: areal.data (and the leaves areal.config, areal.overrides, areal.errors).
"""

"""Multi-turn episodes: many agents at once in one worker, each awaiting an `llm` session whose
every turn the run's policy samples, its trajectory token by token, and the OpenAI-compatible
endpoint in front of the same engine.

May import: areal.graph, areal.engines, areal.models, areal.nodes.workers (and the leaves areal.config,
areal.overrides, areal.errors).
"""

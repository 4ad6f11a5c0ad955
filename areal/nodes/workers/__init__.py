"""What each built-in node kind runs inside its worker: the generate worker's engine, the reward
worker's calls, the trainer's proximal pass and update, the critic's, and the policy copy they load.

May import: areal.graph, areal.engines, areal.kernels, areal.models (and the leaves areal.config,
areal.overrides, areal.errors).
"""

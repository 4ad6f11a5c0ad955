"""The `areal` command, one module per command: each parses its options, loads what it needs and
calls one function. User errors print as the message alone and exit 2; `--debug` adds the traceback.

May import: areal.graph, areal.kernels, areal.data, areal.models, areal.rewards, areal.engines, areal.nodes,
areal.runtime, areal.view (and the leaves areal.config, areal.overrides, areal.errors).
"""

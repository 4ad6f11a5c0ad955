"""Compiling a validated graph and its config into a `Plan`: which process runs which nodes, the
channels between them, each node's bindings and the weights routes. The plan is plain data, printed
by `areal viz --plan`, written to plan.json and read back by every worker.

May import: areal.graph, areal.runtime.wire, areal.runtime.staleness.policies (and the leaves areal.config,
areal.overrides, areal.errors).
"""

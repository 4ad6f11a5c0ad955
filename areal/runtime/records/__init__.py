"""What a run writes down as it goes, and reading it back: the metrics stream and its step records,
per-sample records (`areal samples`), each worker's spans (`areal trace`), held-out rounds and what
counts as solved.

May import: areal.graph, areal.runtime.wire, areal.runtime.storage, areal.runtime.compiler (and the leaves
areal.config, areal.overrides, areal.errors).
"""

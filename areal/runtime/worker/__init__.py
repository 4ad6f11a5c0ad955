"""One worker process, a replica of one pool (`main.py`), and the role it plays: map (a group in, the
pool's nodes run, the group out), stream (a generate or episode node stepped one decode step at a
time) or train (groups in the staleness policy's order, the step, the version published). Its inputs
are joined per group (`join.py`), its outputs routed per channel (`outbox.py`), and what each node
returns is checked against what it declared (`outputs.py`).

May import: areal.graph, areal.nodes, areal.engines, areal.runtime.wire, areal.runtime.storage,
areal.runtime.compiler, areal.runtime.records, areal.runtime.weights, areal.runtime.staleness.policies (and
the leaves areal.config, areal.overrides, areal.errors).
"""

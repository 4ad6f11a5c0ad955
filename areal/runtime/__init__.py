"""Executing a graph: compile it into a plan, start its workers, move batches between them, keep every
trained sample within the staleness bound, route new weights, and write down what happened.

One folder per concern, the lowest first; each may import only what its own docstring names:

- `wire/`: what crosses a socket: the batch codec, the data-plane channels, the control plane's
  messages and commands, the typed weight update, and who may connect.
- `storage/`: what survives a run on disk: the run directory's lock, checkpoints, the names of
  published weight files, and what `--resume` reads back.
- `staleness/policies/`: what η promises under each staleness policy, and the loss mask it leaves.
- `compiler/`: a validated graph and its config become a `Plan`: pools, channels, bindings.
- `records/`: what a run writes down as it goes: metrics and step records, per-sample records,
  spans and traces, held-out rounds, what counts as solved.
- `weights/`: how a trainer's new version reaches the nodes that follow it, a module per transport.
- `staleness/`: the gate a group waits at before it starts, and the source behind it.
- `worker/`: one worker process (a replica of a pool) and its roles: map, stream, train.
- `controller/`: the run itself: starts the workers where the plan places them, feeds the source
  through the gate, answers their reports, restarts the dead, ends the run.

One sample's path: `staleness/admission.py` starts its group, `worker/outbox.py` and
`wire/channels.py` carry it, `worker/main.py` runs it through `worker/stream_role.py` (generate)
and `worker/map_role.py` (reward, advantage), `worker/join.py` joins branches, and
`worker/trainer_role.py` trains it.

May import: areal.graph, areal.kernels, areal.nodes, areal.engines, areal.models, areal.rewards, areal.data
(and the leaves areal.config, areal.overrides, areal.errors).
"""

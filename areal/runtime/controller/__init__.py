"""The run: the controller starts every worker where the plan places it (`placement.py`: local
processes or Ray actors), feeds the source through the staleness gate, answers the workers' reports
(`reports.py`), restarts a dead worker or ends the run (`recovery.py`, `faults.py`), keeps the
accounts of every sample (`accounting.py`) and writes the live state `areal view` reads
(`run_status.py`).

May import: areal.graph, areal.engines, areal.runtime.wire, areal.runtime.storage, areal.runtime.compiler,
areal.runtime.records, areal.runtime.weights, areal.runtime.staleness, areal.runtime.worker (and the leaves
areal.config, areal.overrides, areal.errors).
"""

"""The `areal` command: every command's options in `app.py`, each calling one function of the module
beside it that does its work (`run.py` for `areal run`, `evaluate.py` for `areal eval`, `export.py`,
`samples.py`, `plot.py`; `progress.py` is the live view of the first two). User errors print as the
message alone and exit 2; `--debug` adds the traceback.

May import: areal.graph, areal.kernels, areal.data, areal.models, areal.rewards, areal.engines, areal.nodes,
areal.runtime, areal.view (and the leaves areal.config, areal.overrides, areal.errors).
"""

from areal.cli.app import app, main

__all__ = ["app", "main"]

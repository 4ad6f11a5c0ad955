"""`areal view RUN_DIR`: the run's graph in a browser, annotated live from the run directory's files.

The page (static/) draws the picture `areal viz` draws and writes on it what each pool, node, channel, the
staleness gate and each weights route are doing, beside curves of the step records and a table of recent
samples. The server (server.py, the standard library's) only reads files (run_files.py), so a view can neither
slow nor break the run it watches, and a finished run reopens from its directory. `areal run --view` starts it
as a process of its own beside the run (beside.py).

May import: areal.graph, areal.runtime (and the leaves areal.config, areal.overrides, areal.errors).
"""

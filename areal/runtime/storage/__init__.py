"""What survives a run on disk: the run directory (locked while a run uses it), checkpoints (whole
or absent), the names of published weight files, and what `areal run --resume` reads back.

May import: no other part of areal but the leaves areal.config, areal.overrides, areal.errors.
"""

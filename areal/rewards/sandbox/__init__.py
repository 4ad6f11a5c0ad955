"""The code sandbox: model-written programs run in namespaces (bubblewrap), under seccomp, rlimits
and a cgroup where the machine gives one, each test metered from /proc. `layers.py` says which of
these this machine gives; the modules `launch.JAIL_MODULES` names, and `sandbox_server.py`, run
inside the jail from their source and import nothing of areal.

May import: no other part of areal but the leaves areal.config, areal.overrides, areal.errors.
"""

"""The staleness gate and the source behind it: a group starts only while the slowest trainer is
at most η versions behind (`gate.py`); `admission.py` picks which group starts next and holds every
group started but not yet consumed. What η promises beyond admission is the policy's (`policies/`).

May import: areal.graph, areal.runtime.wire, areal.runtime.compiler, areal.runtime.staleness.policies (and
the leaves areal.config, areal.overrides, areal.errors).
"""

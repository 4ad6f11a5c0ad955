"""The math reward: find a completion's final answer, refuse what no judge should accept
(`rules.py`), then ask the judge (`judge.py`, a child process running `verdict.py`) whether it
equals the reference.

May import: no other part of areal but the leaves areal.config, areal.overrides, areal.errors.
"""

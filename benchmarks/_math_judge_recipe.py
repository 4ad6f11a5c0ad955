"""recipes/math_rl.py as it is, with its reward's judge chosen by the benchmark (bench_math_learning.py).

    MATH_JUDGE=new   the recipe untouched: areal's math reward (math-verify in a killable child + areal's rules)
    MATH_JUDGE=old   the same graph with the `score` node's reward replaced by areal's checker before issue #35,
                     imported from OLD_JUDGE_DIR, the folder bench_math_judge.old_checker() wrote it into

Every other node, the config and the data come from the recipe file itself, so the two runs differ in the
judge alone. Workers load this file again, so the choice travels in the environment.
"""

import dataclasses
import os
import runpy
import sys
from pathlib import Path

from areal.nodes import reward

_recipe = runpy.run_path(str(Path(__file__).resolve().parents[1] / "recipes" / "math_rl.py"))
g = _recipe["g"]
config = _recipe["config"]
del _recipe  # its values are reached through g and config: one Graph and one RunConfig in this namespace

JUDGE = os.environ.get("MATH_JUDGE", "new")
if JUDGE not in ("new", "old"):
    raise ValueError(f"MATH_JUDGE={JUDGE!r}: use new or old")
if JUDGE == "old":
    sys.path.insert(0, os.environ["OLD_JUDGE_DIR"])
    from old_math_answer import math_reward as old_math_reward  # type: ignore[import-not-found]

    g.nodes["score"] = dataclasses.replace(g.nodes["score"], spec=reward("score", old_math_reward(timeout_s=2.0)))

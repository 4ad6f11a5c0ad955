"""tiny_rl.py with a fault injected: its generator skips the weight update of version 2 (it notes the version and
keeps sampling with version 1's weights), the silent failure the mismatch alarm is for."""

from areal.nodes.workers.generate import GenerateNode
from tests.runtime.tiny_rl import config, g  # noqa: F401 (the recipe: its config and graph)

SKIPPED = 2
_load = GenerateNode.load_weights


def _skip_one(self, weights, version):
    if version == SKIPPED:
        self.engine.version = version  # says it holds version 2, holds version 1
        return
    _load(self, weights, version)


GenerateNode.load_weights = _skip_one

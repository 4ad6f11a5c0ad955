"""Reward functions. The code reward runs model-written programs in a sandbox (`code_tests`)."""

from areal.rewards.code_tests import CodeResult, CodeTests, code_tests, extract_code
from areal.rewards.sandbox import SandboxError, SandboxLayers, detect_layers

__all__ = [
    "CodeResult",
    "CodeTests",
    "SandboxError",
    "SandboxLayers",
    "code_tests",
    "detect_layers",
    "extract_code",
]

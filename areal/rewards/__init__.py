"""Reward functions. The code reward runs model-written programs in a sandbox (`code_tests`)."""

from areal.rewards.code_reward import CodeResult, CodeTests, code_tests, extract_code
from areal.rewards.math_answer import MathResult, MathReward, answers_equivalent, extract_answer, math_reward
from areal.rewards.sandbox import SandboxError, SandboxLayers, detect_layers, sandbox_report

__all__ = [
    "CodeResult",
    "CodeTests",
    "MathResult",
    "MathReward",
    "answers_equivalent",
    "math_reward",
    "SandboxError",
    "SandboxLayers",
    "code_tests",
    "detect_layers",
    "extract_answer",
    "extract_code",
    "sandbox_report",
]

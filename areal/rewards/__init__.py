"""Reward functions. The code reward runs model-written programs in a sandbox (`code_tests`).

Benchmarks' own judges: `humaneval_tests` (HumanEval's `check` in the sandbox), `reasoning_gym_score`
(reasoning-gym's verifiers), and the unbiased `pass_at_k` estimator.

May import: areal.rewards.sandbox, areal.rewards.math (and the leaves areal.config, areal.overrides,
areal.errors).
"""

from areal.rewards.code_reward import CodeResult, CodeTests, code_tests, extract_code
from areal.rewards.humaneval import HumanEvalTests, humaneval_program, humaneval_tests
from areal.rewards.math.answer import MathResult, MathReward, answers_equivalent, extract_answer, math_reward
from areal.rewards.pass_at_k import mean_pass_at_k, pass_at_k
from areal.rewards.reasoning_gym import ReasoningGymResult, ReasoningGymScore, extract_rg_answer, reasoning_gym_score
from areal.rewards.sandbox.layers import SandboxError, SandboxLayers, detect_layers, sandbox_report

__all__ = [
    "CodeResult",
    "CodeTests",
    "HumanEvalTests",
    "ReasoningGymResult",
    "ReasoningGymScore",
    "extract_rg_answer",
    "humaneval_program",
    "humaneval_tests",
    "mean_pass_at_k",
    "pass_at_k",
    "reasoning_gym_score",
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

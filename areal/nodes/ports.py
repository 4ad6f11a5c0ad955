"""The port types of the built-in node kinds, in one place so recipes and nodes agree."""

from __future__ import annotations

from areal.graph.ports import Float, Int, Int32, Json

PROMPT = Json["S"]  # task text the policy completes
TESTS = Json["S"]  # hidden tests, one dict per sample
ANSWER = Json["S"]  # reference answer text, one per sample
COMPLETION = Json["S"]  # decoded output text
PROMPT_IDS = Int["S", "T"]
OUTPUT_IDS = Int["S", "T"]
BEHAV_LOGP = Float["S", "T"]  # log π_behav of each output token, recorded while sampling
PROX_LOGP = Float["S", "T"]  # log π_prox: the trainer's weights before this update
REF_LOGP = Float["S", "T"]  # log π_ref: a frozen reference's (trainer.kl_coef's KL loss)
VERSIONS = Int32["S", "T"]  # policy version that produced each output token
LOSS_MASK = Int32["S", "T"]  # 1: the policy sampled the token (trained); 0: the environment wrote it (a tool's output)
TRUNCATED = Int["S"]  # 1: the output was cut at max_new_tokens, not ended by the policy
TURNS = Int["S"]  # completions an episode sampled
TRANSCRIPT = Json["S"]  # an episode's whole context, decoded
REWARD = Float["S"]
ADVANTAGE = Float["S"]
TOKEN_ADVANTAGE = Float["S", "T"]  # one per output token (GAE)
VALUES = Float["S", "T"]  # the critic's V(s_t) before each output token
RETURNS = Float["S", "T"]  # the value targets: advantage + value

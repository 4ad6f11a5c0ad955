"""The rewards' waits on a child take a descriptor past select's limit (tests/descriptors.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from areal.rewards import CodeTests, detect_layers
from areal.rewards.math.answer import MathReward
from tests import descriptors
from tests.rewards.conftest import host_pid_alive, worker_pids


@pytest.fixture
def low_descriptors_taken() -> Iterator[None]:
    with descriptors.low_descriptors_taken():
        yield


def test_a_sandbox_is_killed_and_waited_for_when_its_pidfd_is_past_1023(low_descriptors_taken):
    layers = detect_layers()
    if layers.missing:
        pytest.skip(f"full sandbox unavailable here: {layers.describe()}")
    with CodeTests(timeout_s=1.0, memory_mb=256, workers=1) as scorer:
        (result,) = scorer(["print(1)"], [{"kind": "stdio", "inputs": [""], "outputs": ["1"]}])
        assert result.reward == 1.0
        workers = worker_pids(scorer)
    assert workers and [pid for pid in workers if host_pid_alive(pid)] == []  # close() killed and waited for them


def test_the_math_judge_reads_its_child_on_a_descriptor_past_1023(low_descriptors_taken):
    with MathReward(timeout_s=5.0) as reward:
        right, wrong = reward(["\\boxed{\\frac{1}{2}}", "\\boxed{0.6}"], ["0.5", "0.5"])
    assert (right.reward, wrong.reward) == (1.0, 0.0)

"""The reward node sorts outcomes from failures: nothing becomes a silent 0.0."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from areal.graph.batch import Batch
from areal.graph.roles import FAILED
from areal.nodes.workers.reward import RewardNode, program_of
from areal.rewards import CodeTests, math_reward


@dataclass
class Outcome:
    reward: float
    reason: str | None = None
    detail: str = ""


def _batch(n: int) -> Batch:
    return Batch({"prompt": ["def f(x):\n"] * n, "completion": ["    return x\n"] * n, "tests": [{}] * n,
                  "sample_id": torch.arange(n)})


def test_wrong_answers_score_and_machinery_failures_fail():
    outcomes = [Outcome(1.0), Outcome(0.0, "wrong_answer"), Outcome(0.0, "sandbox_error", "bwrap died"),
                Outcome(float("nan"))]
    out = RewardNode(lambda programs, tests: outcomes)(_batch(4))
    assert out["reward"][:2].tolist() == [1.0, 0.0]
    assert out[FAILED] == {2: "sandbox_error: bwrap died", 3: "reward is nan"}


def test_a_raising_reward_fails_every_sample_with_the_exception_and_the_line_that_raised_it(caplog):
    def broken(programs, tests):
        raise RuntimeError("checker crashed")

    line = broken.__code__.co_firstlineno + 1
    node = RewardNode(broken)
    with caplog.at_level(logging.WARNING, logger="areal.worker"):
        out = node(_batch(3))
        node(_batch(2))
    reason = f"RuntimeError: checker crashed (at test_reward_worker.py:{line} in broken)"
    assert out[FAILED] == dict.fromkeys(range(3), reason)
    assert all(math.isnan(r) for r in out["reward"].tolist())
    logged = [r.getMessage() for r in caplog.records]  # the whole traceback, once for the place it was raised
    assert len(logged) == 1 and "Traceback" in logged[0] and 'raise RuntimeError("checker crashed")' in logged[0]


def test_a_reward_failing_inside_a_library_is_placed_at_the_line_of_its_own_that_called_it():
    def parse(completion):
        values = []
        for text in completion:
            values.append(json.loads(text))
        return values

    reason = RewardNode(parse)(Batch({"completion": ["{", "1"], "sample_id": torch.arange(2)}))[FAILED][0]
    line = parse.__code__.co_firstlineno + 3
    assert reason.startswith("JSONDecodeError: ") and reason.endswith(f"(at test_reward_worker.py:{line} in parse)")


def test_code_programs_are_prompt_plus_completion_and_named_inputs_are_passed():
    seen = {}

    def code(programs, tests):
        seen["programs"] = programs
        return [0.5] * len(programs)

    RewardNode(code)(_batch(1))
    assert seen["programs"] == ["def f(x):\n    return x\n"]

    class ByName:
        input_names = ("completion", "sample_id")

        def __call__(self, completions, ids):
            return [float(i) for i in ids.tolist()]

    assert RewardNode(ByName())(_batch(2))["reward"].tolist() == [0.0, 1.0]


HEADER = "# how many times 6 is in nums\ndef f(nums):\n"
STATEMENT = "Read two integers, print their sum.\n"
SUM = "a, b = map(int, input().split())\nprint(a + b)\n"


@pytest.mark.parametrize(("prompt", "completion", "program"), [
    (HEADER, "    return nums.count(6)\n", HEADER + "    return nums.count(6)\n"),  # a body goes on from its header
    (HEADER, "def f(nums):\n    return nums.count(6)", "def f(nums):\n    return nums.count(6)"),  # a chat reply
    (STATEMENT, SUM, SUM),  # the answer to a problem stated in words
    ("Like this:\n```python\nprint(1)\n```\nNow add two.\n", SUM, SUM),  # a prompt's fence is not the program
    (HEADER, "Here:\n```python\ndef f(nums): ...\n```", "Here:\n```python\ndef f(nums): ...\n```"),
    (HEADER, "    return nums.count(6\n", HEADER + "    return nums.count(6\n"),  # broken: fails as written
    (STATEMENT, "print(1)\x00", STATEMENT + "print(1)\x00"),  # a null byte parses as nothing
])
def test_a_code_program_is_the_prompt_and_completion_where_they_read_as_one_else_the_completion(
        prompt, completion, program):
    assert program_of(prompt, completion) == program


def test_a_program_answering_a_stated_problem_or_restating_its_function_passes_its_tests_in_the_sandbox():
    stdio = {"kind": "stdio", "inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]}
    call = {"kind": "call", "fn_name": "f", "inputs": [[[6, 6, 1]], [[1]]], "outputs": [2, 0]}
    batch = Batch({"prompt": [STATEMENT, HEADER, HEADER],
                   "completion": [SUM, "def f(nums):\n    return nums.count(6)\n", "    return nums.count(6)\n"],
                   "tests": [stdio, call, call], "sample_id": torch.arange(3)})
    scored = RewardNode(CodeTests(timeout_s=5.0))(batch)
    assert scored["reward"].tolist() == [1.0, 1.0, 1.0] and not scored.get(FAILED)


def test_a_prompt_of_chat_messages_reaches_a_reward_as_its_text():
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": STATEMENT}]
    seen = {}

    def code(programs, tests):
        seen["programs"] = programs
        return [0.0] * len(programs)

    class ReadsPrompts:
        input_names = ("prompt",)

        def __call__(self, prompts):
            seen["prompts"] = prompts
            return [0.0] * len(prompts)

    batch = Batch({"prompt": [chat, HEADER], "completion": [SUM, "    return 1\n"], "tests": [{}, {}],
                   "sample_id": torch.arange(2)})
    RewardNode(code)(batch)
    RewardNode(ReadsPrompts())(batch)
    assert seen == {"programs": [SUM, HEADER + "    return 1\n"], "prompts": [f"Be brief.\n\n{STATEMENT}", HEADER]}
    with math_reward(timeout_s=2.0, use_prompt=True) as fn:  # its rules read the prompt's text
        chat = [{"role": "user", "content": "What is 1/2 as a common fraction?"}]
        scored = RewardNode(fn)(Batch({"completion": ["\\boxed{0.5}", "\\boxed{\\frac{1}{2}}"], "answer": ["1/2"] * 2,
                                       "prompt": [chat, chat], "sample_id": torch.arange(2)}))
    assert scored["reward"].tolist() == [0.0, 1.0] and scored[FAILED] == {}


def test_the_math_reward_gets_completions_and_reference_answers():
    completions = ["so \\boxed{0.5}", "\\boxed{3}", "no marked answer"]
    batch = Batch({"completion": completions, "answer": ["\\frac{1}{2}", "4", "4"], "sample_id": torch.arange(3)})
    with math_reward(timeout_s=2.0) as fn:
        out = RewardNode(fn)(batch)
    assert out["reward"].tolist() == [1.0, 0.0, 0.0] and out[FAILED] == {}


def test_the_math_reward_reads_a_number_as_its_reference_and_fails_a_sample_without_one():
    completions = ["\\boxed{4}", "\\boxed{0.5}", "\\boxed{4}", "\\boxed{4}"]
    batch = Batch({"completion": completions, "answer": [4, 0.5, None, True], "sample_id": torch.arange(4)})
    with math_reward(timeout_s=2.0) as fn:
        out = RewardNode(fn)(batch)
    assert out["reward"][:2].tolist() == [1.0, 1.0]
    assert out[FAILED] == {2: "check_failed: the reference answer is NoneType None, not text or a number",
                           3: "check_failed: the reference answer is bool True, not text or a number"}


def test_a_reward_that_overflows_float32_or_is_not_a_number_fails_its_sample_not_the_worker():
    outcomes = [1e39, None, "1.0", True, -1e39, 0.5, False]
    out = RewardNode(lambda programs, tests: outcomes)(_batch(7))
    assert out[FAILED] == {
        0: "reward is 1e+39 (inf as float32)",
        1: "the reward function returned NoneType None, not a number",
        2: "the reward function returned str '1.0', not a number",
        4: "reward is -1e+39 (-inf as float32)",
    }
    assert out["reward"].dtype == torch.float32 and out["reward"][[3, 5, 6]].tolist() == [1.0, 0.5, 0.0]


@pytest.mark.parametrize("returned", [
    lambda c, a: [x == y for x, y in zip(c, a)],  # the natural check: bools
    lambda c, a: np.array(c) == np.array(a),  # numpy's bools
    lambda c, a: [np.float32(x == y) for x, y in zip(c, a)],  # numpy scalars
    lambda c, a: torch.tensor([x == y for x, y in zip(c, a)]),  # a bool tensor
])
def test_a_reward_of_bools_or_numpy_scalars_is_one_for_true_and_zero_for_false(returned):
    def judge(completion, answer):
        return returned(completion, answer)

    batch = Batch({"completion": ["4", "5", "6"], "answer": ["4", "4", "6"], "sample_id": torch.arange(3)})
    out = RewardNode(judge)(batch)
    assert out[FAILED] == {} and out["reward"].tolist() == [1.0, 0.0, 1.0]


def test_a_reward_function_with_a_setup_gets_the_workers_context():
    from areal.config import RunConfig
    from areal.graph.roles import NodeContext
    from areal.runtime.worker.context import WorkerContext

    class Judge:
        input_names = ("completion",)

        def setup(self, context):
            self.where = (context.worker_id, context.node, context.config.seed)

        def __call__(self, completions):
            return [1.0 for _ in completions]

    judge = Judge()
    pool = SimpleNamespace(name="score")
    context = WorkerContext(RunConfig(seed=7), SimpleNamespace(run_dir="/tmp/run"), pool, 1, "score", 0, None,
                            SimpleNamespace(send=lambda *a, **k: None))
    assert isinstance(context, NodeContext)  # what the worker gives is what the docs promise
    node = RewardNode(judge)
    node.setup(context)
    assert judge.where == ("score[1]", "score", 7)
    assert node(Batch({"completion": ["x"]}))["reward"].tolist() == [1.0]


def test_a_function_without_input_names_gets_the_fields_its_parameters_name():
    def ends_with(completion, sample_id, scale=1.0):  # a parameter with a default is not a field
        return [scale * float(c.endswith("x\n")) + int(i) for c, i in zip(completion, sample_id.tolist())]

    assert RewardNode(ends_with)(_batch(2))["reward"].tolist() == [1.0, 2.0]
    program = "def f(x):\n    return x\n"  # a code reward's: prompt + completion
    lengths = RewardNode(lambda programs, tests: [len(p) for p in programs])
    assert lengths(_batch(1))["reward"].tolist() == [len(program)]


def test_rewards_may_come_as_a_tensor_an_array_or_a_generator_and_one_value_for_a_batch_is_refused():
    batch = Batch({"completion": ["a", "bb", "ccc"], "sample_id": torch.arange(3)})
    for returns in (lambda completion: torch.tensor([len(c) for c in completion], dtype=torch.float64),
                    lambda completion: np.array([len(c) for c in completion], dtype=np.float32),
                    lambda completion: (len(c) for c in completion)):
        out = RewardNode(returns)(batch)
        assert out["reward"].tolist() == [1.0, 2.0, 3.0] and out[FAILED] == {}
    for returns, got in ((lambda completion: 0.5, "float 0.5"), (lambda completion: torch.tensor(0.5), "Tensor"),
                         (lambda completion: [1.0], "1 outcomes")):
        with pytest.raises(ValueError, match=f"^the reward function returned {got}.* for 3 samples: it returns one "
                                             "outcome per sample"):
            RewardNode(returns)(batch)


def test_an_async_reward_function_is_awaited_and_what_it_raises_fails_the_batch_naming_its_line():
    async def judge(completion, answer):  # a judge model over HTTP, say
        return [float(c == a) for c, a in zip(completion, answer)]

    async def broken(completion, answer):
        raise ConnectionError("judge unreachable")

    batch = Batch({"completion": ["4", "5"], "answer": ["4", "4"], "sample_id": torch.arange(2)})
    out = RewardNode(judge)(batch)
    assert out[FAILED] == {} and out["reward"].tolist() == [1.0, 0.0]
    failed = RewardNode(broken)(batch)[FAILED]
    assert set(failed) == {0, 1}
    assert failed[0].startswith("ConnectionError: judge unreachable (at test_reward_worker.py:")

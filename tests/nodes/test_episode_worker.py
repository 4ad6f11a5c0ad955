"""The episode runner: one trajectory per episode, its loss mask, log-probs and versions, and how episodes end."""

from __future__ import annotations

import asyncio

import pytest
import torch

from areal.graph.ports import Float, Int
from areal.graph.roles import FAILED
from areal.models.tokenizer import CharTokenizer
from areal.nodes.workers.policy import load_weights
from tests.nodes.episodes import group, run_all, runner_on, scripted, token_logprobs, weights_file

TOKENS_1, TOKENS_2 = 6, 10
FEEDBACK = "# fb\n"


def test_loss_mask_versions_and_logprobs_are_exact_with_an_update_between_turns_and_one_mid_turn(tmp_path):
    gate = asyncio.Event()
    at_gate: list[bool] = []
    turns = []

    async def two_turns(task, llm):
        turns.append(await llm.generate(task["prompt"], max_new_tokens=TOKENS_1))
        at_gate.append(True)
        await gate.wait()  # the test loads version 1 here, between the turns
        turns.append(await llm.generate(FEEDBACK, max_new_tokens=TOKENS_2))
        return 0.5

    runner = runner_on(tmp_path, two_turns)
    runner.policy.engine.eos_token_id = -1  # no early end: every turn runs to its max_new_tokens
    v1, v2 = weights_file(tmp_path, 1), weights_file(tmp_path, 2)
    runner.submit(*group(["def f(x):\n"]))
    while not at_gate:
        assert not runner.step()
    runner.load_weights(load_weights(str(v1)), 1)  # between turns: turn 2 reads its whole context with version 1
    assert runner.version == runner.policy.engine.version == 1  # the runner's version is its engine's
    gate.set()
    steps = 4
    for _ in range(steps):  # the first step prefills turn 2 (its first token) and decodes one; each next decodes one
        assert not runner.step()
    mid_turn = steps + 1  # tokens of turn 2 sampled with version 1
    runner.load_weights(load_weights(str(v2)), 2)  # mid-turn: the rest of turn 2 is re-prefilled, sampled with v2
    (batch, meta), = run_all(runner)

    tok = CharTokenizer()
    prompt = tok.encode("def f(x):\n")
    env = tok.encode(FEEDBACK, add_special_tokens=False)
    first, second = (t.ids for t in turns)
    assert (len(first), len(second)) == (TOKENS_1, TOKENS_2)
    assert batch["prompt_ids"][0].tolist() == prompt
    assert batch["output_ids"][0].tolist() == first + env + second  # the sampled ids as sampled, never re-tokenised
    assert batch["loss_mask"][0].tolist() == [1] * TOKENS_1 + [0] * len(env) + [1] * TOKENS_2
    assert batch["versions"][0].tolist() == ([0] * TOKENS_1 + [1] * len(env) + [1] * mid_turn
                                             + [2] * (TOKENS_2 - mid_turn))
    assert batch["turns"].tolist() == [2] and batch["reward"].tolist() == [0.5] and batch[FAILED] == [None]

    # each sampled token's behaviour log-prob is the one its own version gives it in the whole context before it
    full = prompt + first + env + second
    logp = {v: token_logprobs((tmp_path / "ckpt", w), full) for v, w in ((0, None), (1, v1), (2, v2))}
    behav = batch["behav_logp"][0].tolist()
    for t, (version, mask) in enumerate(zip(batch["versions"][0].tolist(), batch["loss_mask"][0].tolist())):
        position = len(prompt) + t  # the token's index in `full`; logp[v][i] is that of full[i + 1]
        expected = logp[version][position - 1] if mask else 0.0
        assert behav[t] == pytest.approx(expected, abs=2e-4), (t, version)



def test_generate_appends_to_the_text_so_far_so_an_eos_that_ended_a_turn_is_not_read_by_the_next(tmp_path):
    """`llm.generate(text)` is `llm.complete(the session's text + text)`: the reply, its stop string kept, then the
    text; an <eos> that ended a turn is text nobody sent, so the next turn does not read it (the last one stays)."""
    tok = CharTokenizer()
    chars = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731

    async def react(task, llm):
        await llm.generate(task["prompt"], stop=["Observation:"])
        await llm.generate("Observation: 0\n", stop=["Observation:"])
        await llm.generate("Observation: 1\n", stop=["Observation:"])
        return 1.0

    runner = runner_on(tmp_path, react)
    contexts = scripted(runner, [chars("Action: a\n") + [tok.eos_token_id], chars("Action: b\nObservation:"),
                                 chars("done") + [tok.eos_token_id]])
    runner.submit(*group(["Q\n"]))
    (batch, _), = run_all(runner)
    read = ["Q\n", "Q\nAction: a\nObservation: 0\n",
            "Q\nAction: a\nObservation: 0\nAction: b\nObservation:Observation: 1\n"]  # the stop string stays
    assert [tok.decode(c) for c in contexts] == [tok.bos_token + r for r in read]
    assert tok.decode(batch["output_ids"][0].tolist()).endswith("done<eos>")

def test_a_task_of_chat_messages_is_asked_with_llm_chat_and_llm_generate_on_it_says_so(tmp_path):
    """A task file's chat messages reach an episode as the list: `llm.chat` renders them with their roles in the
    model's template; `llm.generate` (which appends text) refuses them by name instead of failing on `str + list`."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q"}]

    async def chats(task, llm):
        await llm.chat(task["prompt"], max_new_tokens=2)
        return 1.0

    async def generates(task, llm):
        await llm.generate(task["prompt"], max_new_tokens=2)
        return 1.0

    runner = runner_on(tmp_path, chats, chat=True)
    tok = runner.policy.tokenizer
    contexts = scripted(runner, [tok.encode("A", add_special_tokens=False) + [tok.eos_token_id]])
    runner.submit(*group([messages]))
    (batch, _), = run_all(runner)
    assert batch[FAILED] == [None]
    assert tok.decode(contexts[0], skip_special_tokens=False) == tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)  # the system message is the system's

    runner = runner_on(tmp_path, generates, chat=True)
    runner.submit(*group([messages]))
    (batch, _), = run_all(runner)
    assert batch[FAILED][0].startswith("the episode raised ConversationError: llm.generate takes text; this prompt "
                                       "is chat messages: ask with `await llm.chat(messages)`")


def test_an_episode_that_raises_fails_its_own_sample_with_the_reason_and_its_siblings_train(tmp_path):
    async def flaky(task, llm):
        done = await llm.generate(task["prompt"], max_new_tokens=3)
        if llm.sample_id % 2:
            raise RuntimeError("the tool crashed")
        return {"reward": 1.0, "score": float(len(done.ids))}

    where = f"(at test_episode_worker.py:{flaky.__code__.co_firstlineno + 3} in flaky)"

    runner = runner_on(tmp_path, flaky, outputs={"score": Float["S"]})
    runner.submit(*group(["a", "b"], group_id=4, samples=2))
    (batch, meta), = run_all(runner)
    assert batch["sample_id"].tolist() == [8, 9, 10, 11]  # group g's sample k is g·G + k, row by row
    assert batch[FAILED] == [None, f"the episode raised RuntimeError: the tool crashed {where}"] * 2
    assert batch["reward"].tolist() == [1.0, 0.0, 1.0, 0.0] and batch["score"].tolist()[0] > 0


@pytest.mark.filterwarnings("ignore:coroutine 'EpisodeLLM.generate' was never awaited")
def test_an_llm_call_not_awaited_is_said_as_such(tmp_path):
    async def hasty(task, llm):
        await llm.generate(task["prompt"], max_new_tokens=2)
        return float(len(llm.generate("more").text))  # the coroutine, not its completion

    runner = runner_on(tmp_path, hasty)
    runner.submit(*group(["a"], samples=1))
    (batch, _), = run_all(runner)
    assert batch[FAILED][0].startswith("the episode raised AttributeError: 'coroutine' object has no attribute "
                                       "'text' (an llm call not awaited?) (at test_episode_worker.py:")


@pytest.mark.parametrize("returned,why", [
    ({"reward": 1.0, "extra": 2}, "run returned 'extra', which the node does not declare"),
    ({"reward": float("nan")}, "the reward must be a finite number, got nan"),
    ({"reward": 1.0}, "run returned no 'turns_used'"),
    ({"reward": 1.0, "turns_used": "two"}, "output 'turns_used' is declared int64[S], got 'two'"),
    (None, "run returned nothing and no reward was posted"),
])
def test_what_an_episode_returns_is_checked_and_a_wrong_return_fails_the_sample_naming_it(tmp_path, returned, why):
    async def returns(task, llm):
        await llm.generate(task["prompt"], max_new_tokens=2)
        return returned

    runner = runner_on(tmp_path, returns, outputs={"turns_used": Int["S"]})
    runner.submit(*group(["x"]))
    (batch, _), = run_all(runner)
    assert why in batch[FAILED][0]


def test_an_episode_that_samples_nothing_or_runs_too_long_fails(tmp_path):
    forever = asyncio.Event()

    async def idle(task, llm):
        if task["prompt"] == "wait":
            await llm.generate("x", max_new_tokens=1)
            await forever.wait()
        return 1.0

    runner = runner_on(tmp_path, idle, timeout_s=0.2)
    runner.submit(*group(["quick", "wait"]))
    (batch, _), = run_all(runner)
    assert batch[FAILED][0].startswith("the episode sampled nothing")
    assert batch[FAILED][1].startswith("the episode ran past timeout_s=0.2")


def test_a_group_reissued_while_its_episodes_run_is_run_once(tmp_path):
    starts: list[int] = []

    async def once(task, llm):
        starts.append(llm.sample_id)
        await llm.generate(task["prompt"], max_new_tokens=2)
        return 1.0

    runner = runner_on(tmp_path, once)
    runner.submit(*group(["p"], group_id=7, samples=2))
    runner.submit(*group(["p"], group_id=7, samples=2))  # re-issued after a crash downstream
    done = run_all(runner)
    assert len(done) == 1 and sorted(starts) == [14, 15]


def test_a_full_context_is_a_clear_failure_not_a_crash(tmp_path):
    async def long(task, llm):
        while True:  # the model's context is 256 tokens
            await llm.generate("y" * 40, max_new_tokens=8)

    runner = runner_on(tmp_path, long)
    runner.submit(*group(["go"]))
    (batch, _), = run_all(runner)
    assert "the episode's context is full" in batch[FAILED][0] and "of the model's 256" in batch[FAILED][0]
    assert len(batch["prompt_ids"][0]) + len(batch["output_ids"][0]) <= 256


def test_many_episodes_decode_together(tmp_path):
    async def three_turns(task, llm):
        for _ in range(3):
            await llm.generate(task["prompt"], max_new_tokens=4)
        return 1.0

    runner = runner_on(tmp_path, three_turns, generation={"max_new_tokens": 8, "stop": [], "max_batch": 32})
    runner.policy.engine.eos_token_id = -1
    runner.submit(*group([f"p{i}" for i in range(16)], samples=2))
    steps = 0
    done = []
    while runner.pending():
        done += runner.step()
        steps += 1
    (batch, _), = done
    assert batch.size == 32 and batch["turns"].tolist() == [3] * 32
    # 32 episodes x 3 turns x 4 tokens, decoded side by side: about 3 x 4 steps (plus idle rounds), not 32 x 12
    assert steps < 40, steps
    assert torch.equal(batch["loss_mask"].lengths, batch["output_ids"].lengths)

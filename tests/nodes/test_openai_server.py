"""The OpenAI-compatible endpoint: the ids it records are the ids sampled, and a bad request is a 4xx, never a crash.

The agents here are episodes that talk to the endpoint over real HTTP on 127.0.0.1, on the runner's own event loop,
with the official `openai` client or raw aiohttp; the runner is stepped as its worker would step it.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from areal.graph.roles import FAILED
from areal.models.tokenizer import CharTokenizer
from tests.nodes.episodes import group, run_all, runner_on

pytestmark = pytest.mark.agent
openai = pytest.importorskip("openai")
aiohttp = pytest.importorskip("aiohttp")

LETTERS = list("abcdefghijklmnopqrstuvwxyz")


def test_token_ids_from_the_endpoint_are_the_sampled_ids_and_the_conversation_is_never_retokenised(tmp_path):
    replies, sampled = [], []

    async def agent(task, llm):
        client = openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        messages = [{"role": "user", "content": task["prompt"]}]
        for follow_up in ("# test failed\n", "# again\n"):
            reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=16,
                                                         stop=LETTERS, logprobs=True)
            replies.append(reply)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": follow_up}]
        return 1.0

    runner = runner_on(tmp_path, agent, endpoint=True)
    assert runner.server.base_url.startswith("http://127.0.0.1:")  # loopback unless endpoint.host says otherwise
    sample = runner.sampler.sample

    async def recording(*args):
        result = await sample(*args)
        sampled.append(result.output_ids.tolist())
        return result

    runner.sampler.sample = recording
    runner.submit(*group(["def f(x):\n"]))
    (batch, _), = run_all(runner)
    assert batch[FAILED] == [None]

    ids = [r.choices[0].model_extra["token_ids"] for r in replies]
    assert ids == sampled  # what the endpoint returns is what the engine sampled
    tok = CharTokenizer()
    env = tok.encode("# test failed\n", add_special_tokens=False)
    assert batch["prompt_ids"][0].tolist() == tok.encode("def f(x):\n")
    assert batch["output_ids"][0].tolist() == ids[0] + env + ids[1]  # the plain template: contents in order
    assert batch["loss_mask"][0].tolist() == [1] * len(ids[0]) + [0] * len(env) + [1] * len(ids[1])
    first = replies[0].choices[0]
    assert [c.logprob for c in first.logprobs.content] == pytest.approx(batch["behav_logp"][0][: len(ids[0])].tolist())
    # the reply the agent saw was cut before its stop letter, so re-tokenising the conversation would lose the
    # sampled letter (and anything after it) that the policy did read on the next turn
    seen = tok.encode(first.message.content, add_special_tokens=False)
    assert first.finish_reason == "stop" and len(seen) < len(ids[0])
    rendered = tok.encode("def f(x):\n" + first.message.content + "# test failed\n")
    assert rendered != batch["prompt_ids"][0].tolist() + ids[0] + env


def test_completion_prompts_must_extend_the_session_and_a_posted_reward_is_the_episodes(tmp_path):
    outcomes = []

    async def agent(task, llm):
        async with aiohttp.ClientSession(headers={"X-Areal-Session": llm.api_key}) as http:
            url = f"{llm.base_url}/completions"
            async with http.post(url, json={"model": "p", "prompt": task["prompt"], "max_tokens": 4}) as r:
                first = await r.json()
            extended = task["prompt"] + first["choices"][0]["text"] + "# more\n"
            async with http.post(url, json={"model": "p", "prompt": extended, "max_tokens": 4}) as r:
                outcomes.append((r.status, await r.json()))
            async with http.post(url, json={"model": "p", "prompt": "something else", "max_tokens": 4}) as r:
                outcomes.append((r.status, await r.json()))
            async with http.post(f"{llm.base_url}/reward", json={"reward": 0.25}) as r:
                outcomes.append((r.status, await r.json()))
        return None  # the reward was posted

    runner = runner_on(tmp_path, agent, endpoint=True)
    runner.submit(*group(["def f(x):\n"]))
    (batch, _), = run_all(runner)
    (ok, second), (refused, error), (posted, _) = outcomes
    assert ok == 200 and second["choices"][0]["text"] is not None
    assert refused == 400 and "the prompt does not extend this session's text" in error["error"]["message"]
    assert posted == 200 and batch["reward"].tolist() == [0.25] and batch["turns"].tolist() == [2]


GOOD = {"model": "p", "messages": [{"role": "user", "content": "def f(x):\n"}], "max_tokens": 3}
MALFORMED = [  # (method, path, headers, body, status, what the message says)
    ("POST", "/v1/chat/completions", {}, GOOD, 401, "no session"),
    ("POST", "/v1/chat/completions", {"Authorization": "Bearer nope"}, GOOD, 401, "unknown session"),
    ("POST", "/v1/chat/completions", None, b"not json", 400, "the body is not JSON"),
    ("POST", "/v1/chat/completions", None, b"\xff\xfe\x00", 400, "the body is not JSON"),
    ("POST", "/v1/chat/completions", None, b"[" * 100_000 + b"]" * 100_000, 400, "the body is not JSON"),
    ("POST", "/v1/chat/completions", None, [1, 2], 400, "must be a JSON object"),
    ("POST", "/v1/chat/completions", None, {"model": "p"}, 400, "'messages' is required"),
    ("POST", "/v1/chat/completions", None, {"messages": []}, 400, "non-empty list"),
    ("POST", "/v1/chat/completions", None, {"messages": "hi"}, 400, "non-empty list"),
    ("POST", "/v1/chat/completions", None, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "role must be"),
    ("POST", "/v1/chat/completions", None, {"messages": [{"role": "user", "content": 5}]}, 400, "content must be"),
    ("POST", "/v1/chat/completions", None, {**GOOD, "stream": True}, 400, "streaming is not supported"),
    ("POST", "/v1/chat/completions", None, {**GOOD, "n": 3}, 400, "n must be 1"),
    ("POST", "/v1/chat/completions", None, {**GOOD, "temperature": 0.2}, 400, "the run's temperature=1.0"),
    ("POST", "/v1/chat/completions", None, {**GOOD, "max_tokens": -1}, 400, "max_tokens must be a positive integer"),
    ("POST", "/v1/chat/completions", None, {**GOOD, "max_tokens": "many"}, 400, "max_tokens must be a positive"),
    ("POST", "/v1/chat/completions", None, {**GOOD, "stop": 5}, 400, "stop must be a string"),
    ("POST", "/v1/chat/completions", None, {**GOOD, "tools": [{"type": "function"}]}, 400, "unsupported fields: tools"),
    ("POST", "/v1/chat/completions", None, {**GOOD, "tool_choice": "auto"}, 400, "function calling is not supported"),
    ("POST", "/v1/chat/completions", None, b"{" + b" " * 1_100_000 + b"}", 413, "largest body"),
    ("GET", "/v1/chat/completions", None, None, 405, "Method Not Allowed"),
    ("POST", "/v1/nothing", None, GOOD, 404, "Not Found"),
    ("POST", "/v1/completions", None, {"prompt": {"a": 1}}, 400, "'prompt' is required"),
    ("POST", "/v1/completions", None, {"prompt": [1, 99999]}, 400, "ids of this model's vocabulary"),
    ("POST", "/v1/completions", None, {"prompt": "x", "echo": True}, 400, "echo: not supported"),
    ("POST", "/v1/reward", None, {"reward": "high"}, 400, "a reward must be a finite number"),
    ("POST", "/v1/reward", None, {"reward": float("inf")}, 400, "the body is not JSON"),  # Infinity is not JSON
]


def test_malformed_requests_get_a_4xx_with_a_message_and_the_endpoint_goes_on(tmp_path):
    got = []

    async def agent(task, llm):
        auth = {"Authorization": f"Bearer {llm.api_key}"}
        async with aiohttp.ClientSession() as http:
            for method, path, headers, body, _, _ in MALFORMED:
                data = body if isinstance(body, bytes) or body is None else json.dumps(body, allow_nan=True).encode()
                async with http.request(method, llm.base_url.removesuffix("/v1") + path, data=data,
                                        headers=auth if headers is None else headers) as r:
                    got.append((r.status, (await r.json())["error"]["message"]))
            host, port = llm.base_url.removeprefix("http://").split("/")[0].split(":")
            reader, writer = await asyncio.open_connection(host, int(port))  # not HTTP at all
            writer.write(b"HELLO THERE\r\n\r\n")
            await writer.drain()
            got.append((int((await reader.read(64)).split()[1]), "raw"))
            writer.close()
            async with http.post(f"{llm.base_url}/chat/completions", json=GOOD, headers=auth) as r:
                got.append((r.status, "the endpoint still answers"))
        return 1.0

    runner = runner_on(tmp_path, agent, endpoint=True)
    runner.submit(*group(["x"]))
    (batch, _), = run_all(runner)
    for (status, message), (method, path, _, _, want, says) in zip(got, MALFORMED):
        assert (status, says in message) == (want, True), (method, path, message)
    assert got[-2:] == [(400, "raw"), (200, "the endpoint still answers")]
    assert batch[FAILED] == [None] and batch["turns"].tolist() == [1]  # only the good request sampled

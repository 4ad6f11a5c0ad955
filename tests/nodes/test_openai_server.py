"""The OpenAI-compatible endpoint: the ids it records are the ids sampled, and a bad request is a 4xx, never a crash.

The agents here are episodes that talk to the endpoint over real HTTP on 127.0.0.1, on the runner's own event loop,
with the official `openai` client or raw aiohttp; the runner is stepped as its worker would step it.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from areal.graph.roles import FAILED
from areal.models.tokenizer import CharTokenizer
from tests.nodes.episodes import group, run_all, runner_on, scripted

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
    first = replies[0].choices[0]
    # the reply the agent saw was cut before its stop letter, and it sent the reply back so: the sampled letter is
    # taken back, so the second turn reads the reply, then the follow-up (the plain template: contents in order)
    env = tok.encode("# test failed\n", add_special_tokens=False)
    assert batch["prompt_ids"][0].tolist() == tok.encode("def f(x):\n")
    output = batch["output_ids"][0].tolist()
    kept = output[: len(output) - len(env) - len(ids[1])]
    assert first.finish_reason == "stop" and kept == ids[0][: len(kept)] and len(kept) < len(ids[0])
    assert tok.decode(kept, skip_special_tokens=True) == first.message.content
    assert output == kept + env + ids[1]
    assert batch["loss_mask"][0].tolist() == [1] * len(kept) + [0] * len(env) + [1] * len(ids[1])
    logprobs = [c.logprob for c in first.logprobs.content]  # every sampled token's, the one taken back included
    assert len(logprobs) == len(ids[0]) and logprobs[: len(kept)] == pytest.approx(
        batch["behav_logp"][0][: len(kept)].tolist())


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


def test_the_policy_reads_exactly_what_a_react_agent_sent_with_its_stop_strings_kept_or_dropped(tmp_path):
    """Turn by turn, the context the policy samples from is the tokenised text the agent sent: a ReAct agent that
    writes the stop string back ("Observation:" after a reply cut at it) is read once, not twice; an agent that
    sends the reply back without it has the sampled stop text taken back."""
    contexts: dict[int, list[list[int]]] = {0: [], 1: []}
    sent: dict[int, list[str]] = {0: [], 1: []}
    stops: dict[int, list[str]] = {0: [], 1: []}

    async def agent(task, llm):
        episode = 0 if task["prompt"].startswith("a") else 1
        async with aiohttp.ClientSession(headers={"X-Areal-Session": llm.api_key}) as http:
            prompt = task["prompt"]
            for turn in range(3):
                sent[episode].append(prompt)
                body = {"model": "p", "prompt": prompt, "max_tokens": 6, "stop": LETTERS}
                async with http.post(f"{llm.base_url}/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                    choice = (await r.json())["choices"][0]
                stop_text = CharTokenizer().decode(choice["token_ids"], skip_special_tokens=True)[len(choice["text"]):]
                stops[episode].append(stop_text)
                # episode 0 writes the stop string back, as ReAct does; episode 1 does not
                prompt += choice["text"] + (stop_text if episode == 0 else "") + f" obs{turn}\n"
        return 1.0

    runner = runner_on(tmp_path, agent, endpoint=True)
    sample = runner.sampler.sample

    async def recording(request_id, context, *rest):
        contexts[request_id // 1024].append(list(context))
        return await sample(request_id, context, *rest)

    runner.sampler.sample = recording
    runner.submit(*group(["a = 1\n", "b = 2\n"]))
    (batch, _), = run_all(runner)
    tok = CharTokenizer()
    assert all(any(s for s in stops[e][:2]) for e in (0, 1))  # a reply cut at a stop string, then another turn
    for episode in (0, 1):
        assert [tok.decode(c, skip_special_tokens=True) for c in contexts[episode]] == sent[episode]
        assert [c[0] for c in contexts[episode]] == [tok.bos_token_id] * 3
        assert not any(tok.eos_token_id in c for c in contexts[episode])  # an <eos> the agent did not send: not read
    # the trainer gets the last context and the last turn's ids, nothing else: every token once
    for row, episode in enumerate((0, 1)):
        trained = tok.decode(batch["prompt_ids"][row].tolist() + batch["output_ids"][row].tolist(),
                             skip_special_tokens=True)
        assert trained.startswith(sent[episode][-1])



def test_an_eos_that_ends_an_action_is_taken_back_on_completions_so_the_policy_reads_what_the_agent_sent(tmp_path):
    """A ReAct agent stopped at "Observation:": the policy ends its first action with <eos> instead, its second at the
    stop string. The agent writes "Observation: ..." after each reply; the next context is exactly that text, with no
    <eos> in it (text cannot hold one). The last turn's <eos> ends the episode and stays: nothing follows it."""
    tok = CharTokenizer()
    chars = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    sent = []

    async def agent(task, llm):
        async with aiohttp.ClientSession(headers={"X-Areal-Session": llm.api_key}) as http:
            prompt = task["prompt"]
            for turn in range(3):
                sent.append(prompt)
                body = {"model": "p", "prompt": prompt, "max_tokens": 16, "stop": ["Observation:"]}
                async with http.post(f"{llm.base_url}/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                    prompt += (await r.json())["choices"][0]["text"] + f"Observation: {turn}\n"
        return 1.0

    runner = runner_on(tmp_path, agent, endpoint=True)
    contexts = scripted(runner, [chars("Action: a\n") + [tok.eos_token_id], chars("Action: b\nObservation:"),
                                 chars("done") + [tok.eos_token_id]])
    runner.submit(*group(["Q: 1+1\n"]))
    (batch, _), = run_all(runner)
    assert [tok.decode(c) for c in contexts] == [tok.bos_token + s for s in sent]  # special tokens shown
    trained = batch["prompt_ids"][0].tolist() + batch["output_ids"][0].tolist()
    assert tok.decode(trained) == tok.bos_token + sent[-1] + "done" + tok.eos_token
    assert batch["loss_mask"][0].tolist()[-5:] == [1] * 5  # "done<eos>": the episode's own end is trained


@pytest.mark.parametrize("model, end", [("plain", "<eos>"), ("chatml", "<|im_end|>"), ("chatml", "<|endoftext|>")])
def test_on_chat_the_policy_reads_the_template_rendering_of_what_the_agent_sent_and_its_own_end_of_turn(
        tmp_path, model, end):
    """Each reply ends with a sampled end token. The next context is what the template renders of the messages the
    agent sent: ChatML writes <|im_end|> after each assistant turn, so a sampled <|im_end|> stays where the policy
    sampled it (trained: it is the model's own end of turn, as Qwen2's and SmolLM2's templates have it); any other
    end token is taken back and the template's written. Without a template the contents follow each other, and an
    <eos> (which text cannot hold) is taken back."""
    sent = []

    async def agent(task, llm):
        client = openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        messages = [{"role": "user", "content": task["prompt"]}]
        for follow_up in ("Observation: 2\n", "Observation: 3\n"):
            sent.append(list(messages))
            reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=16)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": follow_up}]
        return 1.0

    runner = runner_on(tmp_path, agent, endpoint=True, chat=model == "chatml")
    tok = runner.policy.tokenizer
    end_id = tok.convert_tokens_to_ids(end)
    contexts = scripted(runner, [tok.encode(f"Action: {a}\n", add_special_tokens=False) + [end_id] for a in "ab"])
    runner.submit(*group(["Q: 1+1\n"]))
    (batch, _), = run_all(runner)
    if model == "chatml":
        rendered = [tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in sent]
    else:
        rendered = [tok.bos_token + "".join(m["content"] for m in messages) for messages in sent]
    assert [tok.decode(c, skip_special_tokens=False) for c in contexts] == rendered
    first_end = len(contexts[0]) + len(tok.encode("Action: a\n", add_special_tokens=False))
    kept = contexts[1][first_end] == end_id
    assert kept == (end == "<|im_end|>")
    if kept:  # the sampled end of turn is in the trajectory as sampled: mask 1, its log-prob
        at = first_end - len(batch["prompt_ids"][0])
        assert (batch["loss_mask"][0][at].item(), batch["behav_logp"][0][at].item()) == (1, -1.0)



def test_a_prompt_of_ids_is_read_as_sent_with_or_without_the_eos_that_ended_the_last_reply(tmp_path):
    tok = CharTokenizer()
    sent: dict[int, list[list[int]]] = {0: [], 1: []}

    async def agent(task, llm):
        episode = 0 if task["prompt"] == "a" else 1
        async with aiohttp.ClientSession(headers={"X-Areal-Session": llm.api_key}) as http:
            prompt = tok.encode(task["prompt"])
            for _ in range(2):
                sent[episode].append(prompt)
                async with http.post(f"{llm.base_url}/completions", json={"prompt": prompt, "max_tokens": 4}) as r:
                    assert r.status == 200, await r.text()
                    ids = (await r.json())["choices"][0]["token_ids"]
                # episode 0 sends the reply's ids back whole, its <eos> included; episode 1 without it
                prompt = prompt + (ids if episode == 0 else ids[:-1]) + tok.encode("!", add_special_tokens=False)
        return 1.0

    runner = runner_on(tmp_path, agent, endpoint=True)
    reply = tok.encode("xy", add_special_tokens=False) + [tok.eos_token_id]
    contexts = scripted(runner, [reply] * 4)
    runner.submit(*group(["a", "b"]))
    run_all(runner)
    assert sorted(contexts) == sorted(sent[0] + sent[1])  # each context is the ids its agent sent

def test_completion_logprobs_give_the_sampled_log_probs_and_alternatives_are_refused_before_any_turn(tmp_path):
    outcomes = []

    async def agent(task, llm):
        async with aiohttp.ClientSession(headers={"X-Areal-Session": llm.api_key}) as http:
            for logprobs in (3, True, 0):
                body = {"model": "p", "prompt": task["prompt"], "max_tokens": 4, "logprobs": logprobs}
                async with http.post(f"{llm.base_url}/completions", json=body) as r:
                    outcomes.append((r.status, await r.json()))
        return 1.0

    runner = runner_on(tmp_path, agent, endpoint=True)
    runner.submit(*group(["def f(x):\n"]))
    (batch, _), = run_all(runner)
    (three, refused), (true, _), (zero, ok) = outcomes
    assert three == true == 400 and refused["error"]["param"] == "logprobs"
    assert "only 0 is supported" in refused["error"]["message"]
    # the refused requests took no turn: the same first prompt was then answered
    assert zero == 200 and batch["turns"].tolist() == [1]
    logprobs = ok["choices"][0]["logprobs"]
    assert logprobs["token_logprobs"] == pytest.approx(batch["behav_logp"][0].tolist())
    assert logprobs["top_logprobs"] == [{}] * len(logprobs["tokens"])


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


@pytest.mark.slow  # 600 clients on a loop kept busy: about 20 s
def test_hundreds_of_agents_connecting_at_once_to_a_busy_worker_are_all_served():
    """Every episode of a held-out round may connect at once while the worker's loop decodes; with aiohttp's
    default listen backlog (128) some of those connections were reset (the openai client's ReadError)."""
    from areal.config import EndpointConfig
    from areal.nodes.episodes.openai_server import Endpoint

    async def burst() -> list[str]:
        endpoint = Endpoint({}, "policy", EndpointConfig(), temperature=1.0, top_p=1.0)
        base_url = await endpoint.start()
        decoding = True

        async def decode_steps():  # the loop busy 0.2 s at a time, as between a worker's awaits
            while decoding:
                step_ends = time.perf_counter() + 0.2
                while time.perf_counter() < step_ends:
                    pass
                await asyncio.sleep(0)

        async def agent() -> str:
            async with openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0, timeout=120) as client:
                try:
                    await client.completions.create(model="policy", prompt="def f(x):\n")
                except openai.AuthenticationError as refused:  # an answer: this key names no episode
                    return refused.message
                except openai.APIConnectionError as err:
                    return repr(err.__cause__)
                return "served with no session"

        busy = asyncio.create_task(decode_steps())
        try:
            return await asyncio.gather(*(agent() for _ in range(600)))
        finally:
            decoding = False
            await busy
            await endpoint.close()

    answers = asyncio.run(burst())
    assert len(answers) == 600 and set(answers) == {answers[0]} and "unknown session" in answers[0]

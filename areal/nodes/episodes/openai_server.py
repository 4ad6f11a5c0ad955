"""An OpenAI-compatible endpoint in front of the policy's engine, in the episode worker's own process.

`/v1/chat/completions`, `/v1/completions`, `/v1/models`, and `/v1/reward` (an episode's reward, for
an agent that posts it). Each request names its session, that is its episode: the API key the
episode's `llm.api_key` carries (`Authorization: Bearer KEY`, what the `openai` client sends), or
the header `X-Areal-Session: KEY`. A turn goes through the episode's own `llm` (nodes/episodes/llm.py), so
the chat template is applied once, server-side, the ids recorded are the ids sampled, and each
reply carries them (`token_ids`) with the version of each (`versions`).

Why here and not a pool of its own: the endpoint, the episodes and the engine share one event loop,
so a request costs a function call to reach the engine and its tokens land in the episode's
trajectory without another hop; new weights reach requests in flight exactly as they reach the
Python agent's turns. An external agent process gets `llm.base_url` and `llm.api_key` from its
episode and talks to the same place.

What is refused, with a 4xx and a message (never silently changed): streaming, n > 1, function
calling (`tools`), a temperature or top_p other than the run's (the trainer's log-probs assume
them), penalties, logit bias, top_logprobs (and `logprobs` > 0 on completions: the alternatives to each
token are not recorded), and any field it does not know. Bodies over
endpoint.max_request_bytes get 413. It binds 127.0.0.1 unless endpoint.host says otherwise.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from areal.config import EndpointConfig
from areal.nodes.episodes.conversation import ConversationError
from areal.nodes.episodes.llm import Completion, EpisodeError, EpisodeLLM

log = logging.getLogger("areal.endpoint")

COMMON = {"model", "max_tokens", "stop", "logprobs", "n", "stream", "temperature", "top_p", "user", "seed",
          "metadata", "store", "stream_options", "service_tier", "presence_penalty", "frequency_penalty",
          "top_logprobs"}
CHAT_FIELDS = COMMON | {"messages", "max_completion_tokens", "parallel_tool_calls", "tool_choice"}
COMPLETION_FIELDS = COMMON | {"prompt", "echo", "best_of", "suffix"}
SESSION_HEADER = "X-Areal-Session"
# every episode in flight may connect at once (a held-out round starts hundreds) while the loop decodes: past
# aiohttp's default listen backlog of 128 the openai client's connections were reset (ReadError), 4 to 127 of a
# code_repair_openai step's first 128 episodes failed; the kernel caps it at net.core.somaxconn
LISTEN_BACKLOG = 4096
SOMAXCONN_FILE = Path("/proc/sys/net/core/somaxconn")


def _warn_if_backlog_capped() -> None:
    try:
        cap = int(SOMAXCONN_FILE.read_text())
    except (OSError, ValueError):
        return  # not Linux, or no /proc: nothing to say
    if cap < LISTEN_BACKLOG:
        log.warning("net.core.somaxconn is %d: more agents than that connecting at once may see their connections "
                    "reset; raise it (sysctl -w net.core.somaxconn=%d)", cap, LISTEN_BACKLOG)


class RequestError(ValueError):
    """A request this endpoint refuses: HTTP `status`, and the message says which field and why."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param


def _import_aiohttp() -> Any:
    try:
        from aiohttp import web
    except ImportError:
        raise ImportError("the OpenAI-compatible endpoint (episode(..., endpoint=True)) needs aiohttp: "
                          "pip install 'areal[agent]'; an episode that awaits llm.generate or llm.chat runs "
                          "without it") from None
    return web


class Endpoint:
    def __init__(self, sessions: Mapping[str, EpisodeLLM], model: str, config: EndpointConfig, *,
                 temperature: float, top_p: float, replica: int = 0) -> None:
        self.sessions, self.model, self.config = sessions, model, config
        self.temperature, self.top_p = temperature, top_p
        self.port = config.port + replica if config.port else 0
        self.base_url = ""
        self.requests = 0
        self._runner: Any = None

    async def start(self) -> str:
        """Bind and serve on the running loop; the base URL agents use (`http://127.0.0.1:PORT/v1`)."""
        web = _import_aiohttp()
        app = web.Application(client_max_size=self.config.max_request_bytes, middlewares=[self._errors])
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/reward", self._reward)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.port, backlog=LISTEN_BACKLOG)
        await site.start()
        _warn_if_backlog_capped()
        host, port = self._runner.addresses[0][:2]
        self.port = int(port)
        shown = f"[{host}]" if ":" in str(host) else host
        self.base_url = f"http://{shown}:{self.port}/v1"
        return self.base_url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # -- handlers ---------------------------------------------------------------------------------

    async def _chat(self, request: Any) -> Any:
        llm = self._session(request)
        body = await _body(request)
        _known(body, CHAT_FIELDS)
        if body.get("tool_choice") not in (None, "none"):
            raise RequestError("tool_choice: function calling is not supported; write tool calls in the text",
                               param="tool_choice")
        limit, stop = self._sampling(body, "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens")
        if "messages" not in body:
            raise RequestError("'messages' is required", param="messages")
        if body.get("logprobs") not in (None, True, False):
            raise RequestError("logprobs: true or false (each sampled token's log-prob)", param="logprobs")
        done = await llm.chat(body["messages"], max_new_tokens=limit, stop=stop)
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": done.text},
                                  "finish_reason": done.finish_reason, "logprobs": None}
        if body.get("logprobs"):
            tokens = [llm.tokenizer.decode([i], skip_special_tokens=False) for i in done.ids]
            choice["logprobs"] = {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()),
                                               "top_logprobs": []} for t, lp in zip(tokens, done.logprobs)]}
        return self._reply(done, llm, "chat.completion", "chatcmpl", choice)

    async def _completions(self, request: Any) -> Any:
        llm = self._session(request)
        body = await _body(request)
        _known(body, COMPLETION_FIELDS)
        for name, neutral in (("echo", False), ("best_of", 1), ("suffix", None)):
            if body.get(name, neutral) not in (neutral, None):
                raise RequestError(f"{name}: not supported (it must be {neutral!r} or absent)", param=name)
        limit, stop = self._sampling(body, "max_tokens")
        logprobs = body.get("logprobs")
        if logprobs is not None and (not isinstance(logprobs, int) or isinstance(logprobs, bool) or logprobs != 0):
            raise RequestError(f"logprobs={logprobs!r:.20}: only 0 is supported (each sampled token's log-prob; the "
                               "engine does not record the most likely alternatives); omit it or send 0",
                               param="logprobs")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one prompt
        if isinstance(prompt, list):
            if not prompt or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(llm.tokenizer)
                                     for i in prompt):
                raise RequestError("prompt: a list of token ids must hold ids of this model's vocabulary",
                                   param="prompt")
        elif not isinstance(prompt, str):
            raise RequestError("'prompt' is required: a string, or a list of token ids (one prompt per session)",
                               param="prompt")
        done = await llm.complete(prompt, max_new_tokens=limit, stop=stop)
        choice: dict[str, Any] = {"index": 0, "text": done.text, "finish_reason": done.finish_reason,
                                  "logprobs": None}
        if logprobs == 0:  # the sampled tokens' own log-probs, and no alternatives to each
            tokens = [llm.tokenizer.decode([i], skip_special_tokens=False) for i in done.ids]
            offsets = [sum(len(t) for t in tokens[:k]) for k in range(len(tokens))]
            choice["logprobs"] = {"tokens": tokens, "token_logprobs": done.logprobs,
                                  "top_logprobs": [{} for _ in tokens], "text_offset": offsets}
        return self._reply(done, llm, "text_completion", "cmpl", choice)

    async def _reward(self, request: Any) -> Any:
        web = _import_aiohttp()
        llm = self._session(request)
        body = await _body(request)
        _known(body, {"reward"})
        if "reward" not in body:
            raise RequestError("'reward' is required: a finite number", param="reward")
        try:
            llm.post_reward(body["reward"])
        except EpisodeError as err:
            raise RequestError(str(err), param="reward") from None
        return web.json_response({"sample_id": llm.sample_id, "reward": llm.posted_reward})

    async def _models(self, request: Any) -> Any:
        web = _import_aiohttp()
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model", "created": 0,
                                                              "owned_by": "areal"}]})

    # -- the parts every request shares ----------------------------------------------------------

    def _session(self, request: Any) -> EpisodeLLM:
        auth = request.headers.get("Authorization", "")
        key = request.headers.get(SESSION_HEADER) or (auth[7:].strip() if auth.lower().startswith("bearer ") else "")
        if not key:
            raise RequestError(f"no session: send the episode's api key (Authorization: Bearer KEY) or the header "
                               f"{SESSION_HEADER}", status=401)
        llm = self.sessions.get(key)
        if llm is None:
            raise RequestError("unknown session: this key names no episode in flight here (it ended, or the key "
                               "is wrong)", status=401)
        return llm

    def _sampling(self, body: Mapping[str, Any], limit_field: str) -> tuple[int | None, list[str] | None]:
        """max new tokens and stop strings; what the run's sampling cannot honour is refused, naming the field."""
        if body.get("stream"):
            raise RequestError("stream: streaming is not supported; send stream=false", param="stream")
        if body.get("n", 1) not in (1, None):
            raise RequestError("n: a session records one trajectory, so n must be 1", param="n")
        for name, run_value in (("temperature", self.temperature), ("top_p", self.top_p)):
            value = body.get(name)
            if value is not None and (not _number(value) or not math.isclose(float(value), run_value, abs_tol=1e-6)):
                raise RequestError(f"{name}: this endpoint samples at the run's {name}={run_value} (generation."
                                   f"{name}): the trainer's log-probs assume it; omit {name} or send {run_value}",
                                   param=name)
        for name in ("presence_penalty", "frequency_penalty", "top_logprobs"):
            if body.get(name) not in (None, 0):
                raise RequestError(f"{name}: not supported (it would change what is sampled or reported); omit it",
                                   param=name)
        limit = body.get(limit_field)
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise RequestError(f"{limit_field} must be a positive integer, got {limit!r:.40}", param=limit_field)
        stop = body.get("stop")
        if isinstance(stop, str):
            stop = [stop]
        if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) for s in stop)):
            raise RequestError("stop must be a string or a list of strings", param="stop")
        return limit, stop

    def _reply(self, done: Completion, llm: EpisodeLLM, kind: str, prefix: str, choice: dict[str, Any]) -> Any:
        web = _import_aiohttp()
        self.requests += 1
        choice["token_ids"] = done.ids  # the ids sampled, exactly as the trajectory holds them
        choice["versions"] = done.versions
        return web.json_response({
            "id": f"{prefix}-{llm.sample_id}-{done.turn}", "object": kind, "created": int(time.time()),
            "model": self.model, "choices": [choice],
            "usage": {"prompt_tokens": done.prompt_tokens, "completion_tokens": len(done.ids),
                      "total_tokens": done.prompt_tokens + len(done.ids)},
        })

    @staticmethod
    def _error(status: int, message: str, param: str | None = None) -> Any:
        web = _import_aiohttp()
        kind = "invalid_request_error" if status < 500 else "server_error"
        return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": status}},
                                 status=status)

    @property
    def _errors(self) -> Callable[[Any, Callable[[Any], Awaitable[Any]]], Awaitable[Any]]:
        web = _import_aiohttp()

        @web.middleware
        async def errors(request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
            """Every refusal as an OpenAI-style JSON error: 4xx for the request's faults, 500 (logged) for ours."""
            try:
                return await handler(request)
            except RequestError as err:
                return self._error(err.status, str(err), err.param)
            except (ConversationError, EpisodeError) as err:
                return self._error(400, str(err), "messages" if isinstance(err, ConversationError) else None)
            except web.HTTPException as err:  # 404, 405, 413 from aiohttp itself
                return self._error(err.status, f"{err.reason}: {request.method} {request.path}"
                                   + (f" (largest body: {self.config.max_request_bytes} bytes)"
                                      if err.status == 413 else ""))
            except Exception as err:  # a bug of ours: the request fails, the endpoint and its episodes go on
                log.exception("endpoint: %s %s failed", request.method, request.path)
                return self._error(500, f"internal error: {type(err).__name__}: {err}")

        return errors


async def _body(request: Any) -> dict[str, Any]:
    """The request's JSON object; RequestError (400) when it is not one."""
    raw = await request.read()  # 413 past client_max_size, from aiohttp
    try:
        body = json.loads(raw, parse_constant=_not_json)  # NaN and Infinity are Python's, not JSON's
    except (ValueError, RecursionError) as err:
        raise RequestError(f"the body is not JSON: {str(err)[:120]}") from None
    if not isinstance(body, dict):
        raise RequestError(f"the body must be a JSON object, got {type(body).__name__}")
    return body


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _known(body: Mapping[str, Any], fields: set[str]) -> None:
    unknown = sorted(set(body) - fields)
    if unknown:
        raise RequestError(f"unsupported fields: {', '.join(unknown)} (this endpoint takes: "
                           f"{', '.join(sorted(fields))})", param=unknown[0])


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

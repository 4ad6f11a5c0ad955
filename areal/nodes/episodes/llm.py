"""The `llm` an episode awaits: one session, one trajectory, every turn sampled by the run's policy.

Three ways to ask for a turn, all ending in the same place (`_turn`): work out the ids the
environment adds (nodes/episodes/conversation.py), sample a completion of the whole context so far, and only
then append both to the trajectory, so a turn cancelled half-way (an HTTP client that hung up, an
episode past its time) leaves the trajectory as it was.

- `generate(text)`: append `text` (tokenised on its own; the first one gets the tokenizer's <bos>)
  and sample. The Python way: `await llm.generate(task["prompt"])`, then `await llm.generate(feedback)`
  (a task whose prompt is chat messages asks with `llm.chat`).
- `chat(messages)`: the whole conversation, as the OpenAI chat API sends it; the chat template is
  applied server-side, once, to find what is new.
- `complete(prompt)`: the whole text (or ids) so far, as the OpenAI completions API sends it.

Turns are one at a time (a trajectory is a sequence): a second request while one is in flight is
refused. Each turn's request id is `sample_id * MAX_TURNS + turn`, so a re-run episode draws the
same random numbers turn by turn. The episode's reward is what `run` returns, or else what the agent
posted (`post_reward`, the endpoint's POST /v1/reward).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from areal.engines.generation import new_tokens_fitting
from areal.nodes.episodes.conversation import (
    Added,
    ChatFormat,
    ChatState,
    ConversationError,
    Message,
    TextState,
    messages_from,
)
from areal.nodes.episodes.trajectory import Trajectory

MAX_TURNS = 1024  # completions one episode may sample (request ids are sample_id * MAX_TURNS + turn)


class EpisodeError(ValueError):
    """A turn the session cannot take (its context is full, too many turns, another turn in flight)."""


@dataclass(frozen=True)
class Completion:
    """One turn's reply. `text` is what an agent reads: decoded, cut before the first stop string. `ids` are
    every id sampled (the stop string and <eos> included): the trajectory holds them until the next turn takes
    back what of them the agent's next request does not hold (nodes/episodes/conversation.py)."""

    text: str
    ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str  # "stop" (an end-of-sequence token or a stop string) or "length"
    prompt_tokens: int  # the context the policy read for this turn
    turn: int


Sample = Callable[[int, list[int], int, "list[str] | None"], Awaitable[Any]]  # (request id, ids, max new, stop)


class EpisodeLLM:
    def __init__(self, sample_id: int, sample: Sample, version: Callable[[], int], tokenizer: Any, *,
                 max_new_tokens: int, stops: Sequence[str], context_tokens: int | None,
                 base_url: str | None = None, api_key: str | None = None) -> None:
        self.sample_id = sample_id
        self.base_url, self.api_key = base_url, api_key
        self.trajectory = Trajectory()
        self.posted_reward: float | None = None
        self._sample, self._version = sample, version
        self.tokenizer = tokenizer
        self.max_new_tokens, self.stops, self.context_tokens = max_new_tokens, list(stops), context_tokens
        self.chat_format = ChatFormat(tokenizer)
        self._chat = ChatState(self.chat_format)
        self._text = TextState()
        self._mode: str | None = None  # "text", "ids" or "chat": one session speaks one of them
        self._last: Completion | None = None  # the last turn: what a retraction takes back
        self._busy = False

    # -- the three ways to ask for a turn ---------------------------------------------------------

    async def generate(self, text: str = "", *, max_new_tokens: int | None = None,
                       stop: list[str] | None = None) -> Completion:
        """Append `text` (the environment's) to the context, then sample the policy's continuation."""
        if isinstance(text, list):  # a task's chat messages: the template, not concatenation, joins them
            raise ConversationError("llm.generate takes text; this prompt is chat messages: ask with "
                                    "`await llm.chat(messages)`, which renders them in the model's chat template")
        self._speaks("text")
        known = self._text.known or ""
        return await self.complete(known + text, max_new_tokens=max_new_tokens, stop=stop)

    async def complete(self, prompt: str | list[int], *, max_new_tokens: int | None = None,
                       stop: list[str] | None = None) -> Completion:
        """Sample a continuation of `prompt`, which must extend this session's text (or ids) so far."""
        if isinstance(prompt, str):
            self._speaks("text")
            added, retract = self._environment(self._text.added_text(prompt))
        else:
            self._speaks("ids")
            last = len(self._last.ids) if self._last is not None else 0
            added, retract = self._text.added_ids([int(i) for i in prompt], self.trajectory.ids, last)
        done = await self._turn(added, max_new_tokens, stop, retract)
        if isinstance(prompt, str):
            self._text.record(prompt, done.text, self._stop_text(done))
        return done

    async def chat(self, messages: list[dict[str, Any]] | list[Message], *, max_new_tokens: int | None = None,
                   stop: list[str] | None = None) -> Completion:
        """Sample the assistant's reply to `messages`, which must extend the conversation recorded so far."""
        self._speaks("chat")
        checked = messages_from([m.as_dict() if isinstance(m, Message) else m for m in messages]
                                if isinstance(messages, list) else messages)
        request = self._chat.added_text(checked)
        added, retract = self._environment(request)
        done = await self._turn(added, max_new_tokens, stop, retract)
        self._chat.record(checked, request.read, done.text, self._stop_text(done))
        return done

    def post_reward(self, value: float) -> None:
        """The episode's reward, posted by the agent (when `run` returns none itself)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise EpisodeError(f"a reward must be a finite number, got {value!r:.40}")
        self.posted_reward = float(value)

    # -- one turn ----------------------------------------------------------------------------------

    def _environment(self, added: Added) -> tuple[list[int], int]:
        """The ids a request adds, and how many sampled ids at the trajectory's end it takes back first (see
        `_kept`); the text past the ids that stay is tokenised and added."""
        retract, text = 0, added.text
        if added.from_reply and self._last is not None:
            keep, covered = self._kept(text, self._last.ids, self._last.text)
            retract, text = len(self._last.ids) - keep, text[covered:]
        return self.chat_format.encode(text, first=not self.trajectory.ids), retract

    def _kept(self, text: str, ids: list[int], reply: str) -> tuple[int, int]:
        """How many of the last reply's sampled `ids` stay, and how many characters of `text` (the request's, from
        the reply's start) they stand for. The reply sent back as it was returned is its ids; of what was sampled
        after it (a stop string, an end token) the ids stay as far as `text` holds them: their decoding, each special
        token one that text spells (a template's <|im_end|>; never the built-in <eos>). The rest is taken back."""
        def decoded(k: int, skip: bool) -> str:
            return str(self.tokenizer.decode(ids[:k], skip_special_tokens=skip))

        def spelled(part: list[int]) -> bool:
            return all(self.chat_format.spells(i) for i in self.chat_format.special_ids.intersection(part))

        own = next(k for k in range(len(ids), -1, -1) if reply.startswith(decoded(k, True)))
        while own and ids[own - 1] in self.chat_format.special_ids:
            own -= 1  # a special token after the reply's last character is sampled after it, not part of it
        shown, base = decoded(own, True), decoded(own, False)
        if text.startswith(shown):
            for k in range(len(ids), own, -1):
                full = decoded(k, False)
                if full.startswith(base) and text.startswith(shown + full[len(base):]) and spelled(ids[own:k]):
                    return k, len(shown) + len(full) - len(base)
            return own, len(shown)
        # the request rewrote the reply itself (a template that trims it): its ids stay as far as the text holds them
        keep = next(k for k in range(own, -1, -1) if text.startswith(decoded(k, False)) and spelled(ids[:k]))
        return keep, len(decoded(keep, False))

    def _stop_text(self, done: Completion) -> str:
        """The text the policy sampled after the reply the agent reads: the stop string (special tokens skipped)."""
        full = str(self.tokenizer.decode(done.ids, skip_special_tokens=True))
        return full[len(done.text):] if full.startswith(done.text) else ""

    async def _turn(self, added: list[int], max_new_tokens: int | None, stop: list[str] | None,
                    retract: int = 0) -> Completion:
        if self._busy:
            raise EpisodeError("another turn of this session is in flight; a trajectory takes one turn at a time")
        turn = self.trajectory.turns
        if turn >= MAX_TURNS:
            raise EpisodeError(f"an episode samples at most {MAX_TURNS} completions")
        context = self.trajectory.ids[: len(self.trajectory) - retract] + added
        if not context:
            raise EpisodeError("nothing to complete: the first turn needs a prompt")
        limit = self.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        if limit < 1:
            raise EpisodeError(f"max_new_tokens must be >= 1, got {limit}")
        limit = new_tokens_fitting(limit, len(context), self.context_tokens)
        if limit < 1:
            raise EpisodeError(f"the episode's context is full: {len(context)} tokens of the model's "
                               f"{self.context_tokens}")
        version = self._version()
        self._busy = True
        try:
            result = await self._sample(self.sample_id * MAX_TURNS + turn, context, limit, stop)
        finally:
            self._busy = False
        # only now, with the turn complete, does anything enter (or leave) the trajectory
        self.trajectory.retract(retract)
        self.trajectory.add_environment(added, version)
        ids = result.output_ids.tolist()
        self.trajectory.add_sampled(ids, result.logprobs.tolist(), result.versions.tolist())
        reason = "length" if result.finish_reason == "length" else "stop"
        self._last = Completion(self._reply(ids, stop), ids, result.logprobs.tolist(), result.versions.tolist(),
                                reason, len(context), turn)
        return self._last

    def _reply(self, ids: list[int], stop: list[str] | None) -> str:
        """What the agent reads: the decoded ids, cut before the first stop string."""
        text = str(self.tokenizer.decode(ids, skip_special_tokens=True))
        stops = self.stops if stop is None else stop
        cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=len(text))
        return text[:cut]

    def _speaks(self, mode: str) -> None:
        if self._mode not in (None, mode):
            raise ConversationError(f"this session speaks {self._mode}; a session's turns are all chat messages, "
                                    "all text prompts or all token-id prompts")
        self._mode = mode

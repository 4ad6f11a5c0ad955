"""What the environment adds to an episode's context between two turns, worked out from what the agent sends.

An agent written against an OpenAI-style API re-sends its whole conversation each turn: chat messages,
or a completion prompt that is the whole text so far. Re-rendering and re-tokenising that every turn
would give ids that differ from the ones the policy sampled (a reply cut at a stop string, an <eos> the
text never shows, a template that rewrites earlier replies, BPE merges across a boundary). So the chat
template is applied once per turn, server-side, and only to find the *new* text: the conversation
must extend the one already recorded (the earlier messages, and the replies exactly as they were
returned), the template's rendering of it must extend the rendering of what was recorded, and the
difference is tokenised on its own and appended after the ids the policy sampled. After a reply the
template's own closing text (`<|im_end|>\\n`) is added, less what the policy itself sampled of it.

A tokenizer without a chat template (the built-in char tokenizer) renders messages plainly: their
contents one after another, after the tokenizer's own <bos>: the format its warm start learned.

A reply cut at a stop string is returned without it (as OpenAI does), but the policy sampled the stop
string and its context holds it. What the agent sends next decides, so that the policy reads exactly what
the agent sent: a request whose text keeps the stop string (a ReAct agent writing "Observation: ..." after
a reply cut at "Observation:") extends the trajectory as it is; one without it (the reply sent back as it
was returned) *retracts* the sampled stop text from the trajectory first (`Retract`), so the next turn
reads the reply, then what the agent added. Anything else is refused (`ConversationError`): a session
records one trajectory. This module renders and compares text; it samples nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

ROLES = ("system", "user", "assistant", "tool", "developer")
_PROBE = "\x00areal-reply\x00"  # a reply no template rewrites: where the template's closing text starts


class ConversationError(ValueError):
    """A request that cannot extend this session's trajectory; the message says where and why."""


@dataclass(frozen=True)
class Message:
    role: str
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


def messages_from(raw: Any) -> list[Message]:
    """Chat messages as the OpenAI API sends them (content a string or a list of text parts), checked."""
    if not isinstance(raw, list) or not raw:
        raise ConversationError("'messages' must be a non-empty list of {'role', 'content'} objects")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise ConversationError(f"messages[{i}] must be an object with 'role' and 'content', "
                                    f"got {type(m).__name__}")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise ConversationError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r:.40}")
        if m.get("tool_calls"):
            raise ConversationError(f"messages[{i}] holds tool_calls: function calling is not supported; "
                                    "write tool calls in the text and parse them in the agent")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise ConversationError(f"messages[{i}].content: only text parts are supported")
            content = "".join(p["text"] for p in content)
        if content is None and role == "assistant":
            content = ""
        if not isinstance(content, str):
            raise ConversationError(f"messages[{i}].content must be a string or a list of text parts, "
                                    f"got {type(content).__name__}")
        out.append(Message(role, content))
    return out


class ChatFormat:
    """Messages to text and text to ids: the tokenizer's chat template, or the plain format."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.templated = bool(getattr(tokenizer, "chat_template", None))

    def render(self, messages: Sequence[Message], generation_prompt: bool) -> str:
        if not self.templated:
            return "".join(m.content for m in messages)
        text = self.tokenizer.apply_chat_template([m.as_dict() for m in messages], tokenize=False,
                                                  add_generation_prompt=generation_prompt)
        return str(text)

    def encode(self, text: str, first: bool) -> list[int]:
        """Ids of `text`; the tokenizer's own special tokens (<bos>) only at the very start of a plain episode
        (a template writes its own)."""
        if not text:
            return []
        return list(self.tokenizer.encode(text, add_special_tokens=first and not self.templated))

    def closing(self, messages: Sequence[Message]) -> str:
        """The text the template writes after an assistant reply that ends `messages` (`<|im_end|>\\n`)."""
        if not self.templated:
            return ""
        rendered = self.render([*messages, Message("assistant", _PROBE)], generation_prompt=False)
        at = rendered.rfind(_PROBE)
        return rendered[at + len(_PROBE):] if at >= 0 else ""


@dataclass(frozen=True)
class Added:
    """What a request adds to the trajectory: `text` after it, once the last turn's sampled stop text is
    retracted when `retract` says so (the agent sent the reply back without it)."""

    text: str
    retract: bool = False


class ChatState:
    """The conversation a session has recorded, and the text each new request adds to it."""

    def __init__(self, chat: ChatFormat) -> None:
        self.chat = chat
        self.known: list[Message] = []  # every message so far, each reply as it was returned
        self.pending_closing = ""  # template text after the last reply that the policy did not sample
        self.stop_text = ""  # what the policy sampled after the last reply's text, up to any special token
        self.closing = ""  # the template's whole closing text after the last reply

    def added_text(self, messages: list[Message]) -> Added:
        """What the environment appends before the policy's next turn (ConversationError if nothing can)."""
        if not self.known:
            return Added(self.chat.render(messages, generation_prompt=True))
        k = len(self.known)
        if len(messages) < k:
            raise ConversationError(f"this session has recorded {k} messages and the request sends {len(messages)}; "
                                    "a session records one trajectory: send the whole conversation, or start a new "
                                    "session for a new one")
        known = list(self.known)
        reply = known[-1]
        kept_stop = bool(self.stop_text) and messages[k - 1] == Message("assistant", reply.content + self.stop_text)
        if kept_stop:  # the agent wrote the stop string back into the reply: the policy did read it there
            known[-1] = messages[k - 1]
        for i, (old, new) in enumerate(zip(known, messages)):
            if old != new:
                what = "role" if old.role != new.role else "content"
                raise ConversationError(f"messages[{i}] differs from what this session recorded (its {what}; a reply "
                                        "must be sent back exactly as it was returned, or with the stop string that "
                                        "ended it appended); a session records one trajectory: start a new session "
                                        "for a new one")
        before = self.chat.render(known, generation_prompt=False)
        after = self.chat.render(messages, generation_prompt=True)
        if not after.startswith(before):
            raise ConversationError("the chat template renders this conversation differently from the one recorded "
                                    "(not as an extension of it), so its ids cannot extend the trajectory")
        if self.stop_text and not kept_stop:  # the reply came back without its stop string: retract it
            return Added(self.closing + after[len(before):], retract=True)
        return Added(self.pending_closing + after[len(before):])

    def record(self, messages: list[Message], reply: str, sampled_tail: str, stop_text: str) -> None:
        """The policy answered `messages` with `reply` (what the agent is shown), having sampled `sampled_tail`
        after it (a stop string, an end-of-turn token), of which `stop_text` is the stop string's text (empty
        when the reply ended otherwise)."""
        self.known = [*messages, Message("assistant", reply)]
        self.closing = self.chat.closing(messages)
        self.stop_text = stop_text
        tail = sampled_tail[len(stop_text):]  # after a kept stop string, what of the closing it sampled
        self.pending_closing = self.closing[len(tail):] if self.closing.startswith(tail) else self.closing


class TextState:
    """Completion prompts: each must extend the text so far: the previous prompt and the text returned, with
    or without the stop string that ended it (see the module doc)."""

    def __init__(self) -> None:
        self.known: str | None = None  # the text the policy has read and written, stop strings included
        self.stop_text = ""  # the last turn's stop string as sampled: the end of `known`, not of the reply

    def record(self, prompt: str, reply: str, stop_text: str) -> None:
        self.known, self.stop_text = prompt + reply + stop_text, stop_text

    def added_text(self, prompt: str) -> Added:
        if self.known is None:
            return Added(prompt)
        if prompt.startswith(self.known):
            return Added(prompt[len(self.known):])
        replied = self.known[: len(self.known) - len(self.stop_text)]
        if self.stop_text and prompt.startswith(replied):  # the reply as returned, without its stop string
            return Added(prompt[len(replied):], retract=True)
        same = next((i for i, (a, b) in enumerate(zip(self.known, prompt)) if a != b),
                    min(len(self.known), len(prompt)))
        raise ConversationError(f"the prompt does not extend this session's text (it differs at character "
                                f"{same} of {len(self.known)}); a session records one trajectory: start a new "
                                "session for a new one")

    def added_ids(self, prompt: list[int], trajectory: Sequence[int]) -> list[int]:
        if list(prompt[: len(trajectory)]) != list(trajectory):
            raise ConversationError(f"the prompt's ids do not begin with this session's {len(trajectory)} ids so far; "
                                    "a session records one trajectory: start a new session for a new one")
        return list(prompt[len(trajectory):])

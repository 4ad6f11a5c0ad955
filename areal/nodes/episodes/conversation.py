"""What the environment adds to an episode's context between two turns, worked out from what the agent sends.

An agent written against an OpenAI-style API re-sends its whole conversation each turn: chat messages,
or a completion prompt that is the whole text so far. Re-rendering and re-tokenising that every turn
would give ids that differ from the ones the policy sampled (a reply cut at a stop string, an <eos> the
text never shows, a template that rewrites earlier replies, BPE merges across a boundary). So the chat
template is applied once per turn, server-side, and only to find the *new* text: the conversation
must extend the one already recorded (the earlier messages, and the replies exactly as they were
returned), the template's rendering of it must extend the rendering the policy read, and the
difference is tokenised on its own and appended after the ids the policy sampled.

A tokenizer without a chat template (the built-in char tokenizer) renders messages plainly: their
contents one after another, after the tokenizer's own <bos>: the format its warm start learned.

The policy reads exactly what the agent sent: the text of its request (chat messages rendered by the
template), tokenised as the environment's text is, except that the last reply, sent back as it was
returned, is the ids the policy sampled. Of what it sampled after the reply's text, the ids stay as far as
the request's text holds them where they were sampled; the rest is taken back before the next turn
(`Added.from_reply`; nodes/episodes/llm.py works out the ids):
- a stop string the agent did not send back (a reply is returned without it, as OpenAI does); one the
  agent kept (a ReAct agent writing "Observation: 42" after a reply cut at "Observation:") stays;
- an end token the text does not hold where it was sampled: the built-in tokenizer's <eos> (text cannot
  spell one), a chat model's <|endoftext|> where its template writes <|im_end|>. A template's own
  end-of-turn token that the policy sampled stays: the rendering holds it right there (Qwen2's and
  SmolLM2's ChatML write <|im_end|> after each assistant turn, and that is the token such a model samples).
The last turn's ids stay whole: nothing follows them. Anything that is not an extension (an earlier message
changed, a prompt that rewrites the text so far) is refused (`ConversationError`): a session records one
trajectory. This module renders and compares text; it samples nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

ROLES = ("system", "user", "assistant", "tool", "developer")


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
        self.special_ids = frozenset(getattr(tokenizer, "all_special_ids", ()))
        self._spelled: dict[int, bool] = {}

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

    def spells(self, token_id: int) -> bool:
        """Whether text the environment adds can hold this special token: a chat model's tokenizer reads the text
        `<|im_end|>` as its token; the built-in tokenizer reads `<eos>` as five characters."""
        spelled = self._spelled.get(token_id)
        if spelled is None:
            text = self.tokenizer.convert_ids_to_tokens(token_id)
            spelled = list(self.tokenizer.encode(text, add_special_tokens=False)) == [token_id]
            self._spelled[token_id] = spelled
        return spelled


@dataclass(frozen=True)
class Added:
    """What a request adds to the trajectory. With `from_reply`, `text` runs from the start of the last reply: that
    reply's sampled ids stay as far as `text` holds them, the rest is taken back, and the text past them is added.
    `read` is the whole text the policy reads next (the template's rendering, or the prompt)."""

    text: str
    read: str
    from_reply: bool = False


class ChatState:
    """The conversation a session has recorded, and the text each new request adds to it."""

    def __init__(self, chat: ChatFormat) -> None:
        self.chat = chat
        self.known: list[Message] = []  # every message so far, each reply as it was returned
        self.read = ""  # the rendering the policy read before its last reply
        self.stop_text = ""  # what the policy sampled after the last reply's text, up to any special token

    def added_text(self, messages: list[Message]) -> Added:
        """What the environment appends before the policy's next turn (ConversationError if nothing can)."""
        if not self.known:
            rendered = self.chat.render(messages, generation_prompt=True)
            return Added(rendered, rendered)
        k = len(self.known)
        if len(messages) < k:
            raise ConversationError(f"this session has recorded {k} messages and the request sends {len(messages)}; "
                                    "a session records one trajectory: send the whole conversation, or start a new "
                                    "session for a new one")
        known = list(self.known)
        reply = known[-1]
        if self.stop_text and messages[k - 1] == Message("assistant", reply.content + self.stop_text):
            known[-1] = messages[k - 1]  # the agent wrote the stop string back into the reply
        for i, (old, new) in enumerate(zip(known, messages)):
            if old != new:
                what = "role" if old.role != new.role else "content"
                raise ConversationError(f"messages[{i}] differs from what this session recorded (its {what}; a reply "
                                        "must be sent back exactly as it was returned, or with the stop string that "
                                        "ended it appended); a session records one trajectory: start a new session "
                                        "for a new one")
        after = self.chat.render(messages, generation_prompt=True)
        if not after.startswith(self.read):
            raise ConversationError("the chat template renders this conversation differently from the one the policy "
                                    "read (not as an extension of it), so its ids cannot extend the trajectory")
        return Added(after[len(self.read):], after, from_reply=True)

    def record(self, messages: list[Message], read: str, reply: str, stop_text: str) -> None:
        """The policy, reading `read` (the rendering of `messages`), answered with `reply` (what the agent is shown),
        having sampled `stop_text` after it (the stop string that ended it; empty when the reply ended otherwise)."""
        self.known = [*messages, Message("assistant", reply)]
        self.read, self.stop_text = read, stop_text


class TextState:
    """Completion prompts: each must extend the text so far: the previous prompt and the text returned, with
    or without the stop string that ended it (see the module doc)."""

    def __init__(self) -> None:
        self.prompt: str | None = None  # the text the policy read at the last turn
        self.reply = ""  # what it was answered, as returned
        self.stop_text = ""  # the stop string it sampled after the reply (text: special tokens skipped)

    @property
    def known(self) -> str | None:
        """The session's text: its prompts and replies, stop strings included (what `llm.generate` extends)."""
        return None if self.prompt is None else self.prompt + self.reply + self.stop_text

    def record(self, prompt: str, reply: str, stop_text: str) -> None:
        self.prompt, self.reply, self.stop_text = prompt, reply, stop_text

    def added_text(self, prompt: str) -> Added:
        if self.prompt is None:
            return Added(prompt, prompt)
        if prompt.startswith(self.prompt + self.reply):
            return Added(prompt[len(self.prompt):], prompt, from_reply=True)
        known = self.known or ""
        same = next((i for i, (a, b) in enumerate(zip(known, prompt)) if a != b), min(len(known), len(prompt)))
        raise ConversationError(f"the prompt does not extend this session's text (it differs at character "
                                f"{same} of {len(known)}); a session records one trajectory: start a new "
                                "session for a new one")

    def added_ids(self, prompt: list[int], trajectory: Sequence[int], last_sampled: int) -> tuple[list[int], int]:
        """The ids a prompt of ids adds, and how many at the trajectory's end it takes back first: the ones of the last
        reply it does not repeat (an agent that sends the reply's ids without their <eos>)."""
        same = next((i for i, (a, b) in enumerate(zip(prompt, trajectory)) if a != b),
                    min(len(prompt), len(trajectory)))
        if same < len(trajectory) - last_sampled:
            raise ConversationError(f"the prompt's ids do not begin with this session's {len(trajectory)} ids so far "
                                    f"(they differ at id {same}, before the last reply); a session records one "
                                    "trajectory: start a new session for a new one")
        return list(prompt[same:]), len(trajectory) - same

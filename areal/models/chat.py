"""Prompts to token ids, through the tokenizer's chat template when the model has one.

An instruct model (SmolLM2-Instruct, Qwen2.5-Instruct) was tuned on its chat format: given a bare
prompt it continues the text instead of answering it. So a task's prompt becomes one user message,
rendered by the tokenizer's own template with the assistant turn opened, and the completion is the
assistant's reply. A prompt may also be the chat itself, a list of `{"role", "content"}` messages (a
task file's `messages`, verl's `prompt`): the template renders it with its roles, so a system message
stays the system's. A tokenizer without a template (the built-in char tokenizer, most base models)
gets the prompt as text: a chat's contents joined by blank lines. `generation.chat_template=off`
forces the plain path for a model whose template you do not want.
"""

from __future__ import annotations

from typing import Any, Literal

ChatSetting = Literal["auto", "off"]
Prompt = str | list[dict[str, str]]  # text, or chat messages [{"role": ..., "content": ...}, ...]


def uses_chat(tokenizer: Any, setting: ChatSetting = "auto") -> bool:
    """Whether prompts go through the chat template: "auto" and the tokenizer has one."""
    return setting == "auto" and bool(getattr(tokenizer, "chat_template", None))


def is_chat(prompt: Any) -> bool:
    """Whether `prompt` is a non-empty list of chat messages, each {"role": str, "content": str}."""
    return isinstance(prompt, list) and bool(prompt) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt)


def prompt_text(prompt: Prompt) -> str:
    """The prompt as plain text, for a model without a chat template and for readers of text (a reward): a chat's
    contents joined by blank lines, its roles dropped."""
    return "\n\n".join(m["content"] for m in prompt) if isinstance(prompt, list) else prompt


def render_prompt(tokenizer: Any, prompt: Prompt, chat: bool) -> str:
    """The text the model reads: in the chat template, the chat with its roles (text: one user message); else
    `prompt_text`."""
    if not chat:
        return prompt_text(prompt)
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode_prompt(tokenizer: Any, prompt: Prompt, chat: bool) -> list[int]:
    """Token ids of `render_prompt`; the template writes its own special tokens, so none are added."""
    if not chat:
        return list(tokenizer.encode(prompt_text(prompt)))
    return list(tokenizer.encode(render_prompt(tokenizer, prompt, chat), add_special_tokens=False))

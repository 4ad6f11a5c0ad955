"""Prompts to token ids, through the tokenizer's chat template when the model has one.

An instruct model (SmolLM2-Instruct, Qwen2.5-Instruct) was tuned on its chat format: given a bare
prompt it continues the text instead of answering it. So a task's prompt becomes one user message,
rendered by the tokenizer's own template with the assistant turn opened, and the completion is the
assistant's reply. A tokenizer without a template (the built-in char tokenizer, most base models)
gets the prompt as it is. `generation.chat_template=off` forces the plain path for a model whose
template you do not want.
"""

from __future__ import annotations

from typing import Any, Literal

ChatSetting = Literal["auto", "off"]


def uses_chat(tokenizer: Any, setting: ChatSetting = "auto") -> bool:
    """Whether prompts go through the chat template: "auto" and the tokenizer has one."""
    return setting == "auto" and bool(getattr(tokenizer, "chat_template", None))


def render_prompt(tokenizer: Any, prompt: str, chat: bool) -> str:
    """The text the model reads: the prompt as a user message in the chat template, else the prompt."""
    if not chat:
        return prompt
    messages = [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode_prompt(tokenizer: Any, prompt: str, chat: bool) -> list[int]:
    """Token ids of `render_prompt`; the template writes its own special tokens, so none are added."""
    if not chat:
        return list(tokenizer.encode(prompt))
    return list(tokenizer.encode(render_prompt(tokenizer, prompt, chat), add_special_tokens=False))

"""Turning one JSON record into a task dict, for each record layout a task file may use.

Two task shapes leave this module, the same ones the built-in tasks and the rewards use:

    code: {"task_id", "prompt", "tests": {"kind": "call"|"stdio", "fn_name"?, "inputs", "outputs"}}
    math: {"task_id", "prompt", "answer"}

The prompt is text, or a record's chat messages as a list of {"role", "content"} (areal/models/chat.py).

Besides areal's own layouts (docs/data.md) a record may be in verl's: `prompt` a list of chat messages
and the answer, or the tests as JSON, in `reward_model.ground_truth`, so data prepared for verl trains here as is.

A record that cannot become a task raises `RecordError` with the first thing wrong with it; the
caller adds the file and line. This module reads no files and keeps no state.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Task = dict[str, Any]
ChatTemplate = Callable[[list[dict[str, Any]]], str]

SCHEMAS = ("code", "math")
FIELDS = {"code": ("task_id", "prompt", "tests"), "math": ("task_id", "prompt", "answer")}
CODE_KEYS = ("inputs", "outputs", "input_output")
MATH_KEYS = ("answer", "solution")  # verl's reward_model.ground_truth is read between them
VERL_KEY = "reward_model"  # verl's {"style": "rule", "ground_truth": ...}
_NEEDS = {"code": "a code task needs prompt, inputs, outputs", "math": "a math task needs a problem and an answer"}
_PROMPT_KEYS = {"code": ("prompt", "question"), "math": ("problem", "question", "prompt")}


class RecordError(ValueError):
    """Why a record cannot be a task (the caller prefixes file:line)."""


def detect_schema(record: Any) -> str | None:
    """"code" when a record carries tests, "math" when it carries an answer, else None."""
    if not isinstance(record, dict):
        return None
    if any(k in record for k in CODE_KEYS):
        return "code"
    if any(k in record for k in MATH_KEYS):
        return "math"
    if VERL_KEY in record:
        try:
            tests = _decode_input_output(_ground_truth(record), "'reward_model.ground_truth'")
        except RecordError:
            return "math"
        return "code" if "inputs" in tests else "math"
    return None


def parse_record(record: Any, schema: str, default_id: str, chat_template: ChatTemplate | None) -> Task:
    """The task a decoded JSON record describes under `schema`; `default_id` when it has no id."""
    if not isinstance(record, dict):
        raise RecordError(f"a record must be a JSON object, got {_kind(record)}")
    task_id = _task_id(record, default_id)
    prompt = _prompt(record, schema, chat_template)
    if schema == "code":
        return {"task_id": task_id, "prompt": prompt, "tests": _tests(record)}
    return {"task_id": task_id, "prompt": prompt, "answer": _answer(record)}


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _task_id(record: dict[str, Any], default_id: str) -> str:
    value = record.get("task_id", record.get("id"))
    if value is None:
        return default_id
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise RecordError(f"'task_id'/'id' is {_kind(value)}, expected a string or an integer")
    return str(value)


def _prompt(record: dict[str, Any], schema: str, chat_template: ChatTemplate | None) -> str | list[dict[str, str]]:
    key = next((k for k in (*_PROMPT_KEYS[schema], "messages") if k in record), None)
    if key is None:
        keys = ", ".join(f"'{k}'" for k in (*_PROMPT_KEYS[schema], "messages"))
        raise RecordError(f"missing a prompt: one of {keys} ({_NEEDS[schema]})")
    if key == "messages" or isinstance(record[key], list):  # verl keeps chat messages under 'prompt'
        prompt = _render(record[key], key, chat_template)
    else:
        prompt = _nonempty_str(record[key], key, schema)
    starter = record.get("starter_code") if schema == "code" else None
    if isinstance(starter, str) and starter.strip():
        if isinstance(prompt, list):  # the chat's last message asks for it
            last = prompt[-1]
            return [*prompt[:-1], {**last, "content": f"{last['content'].rstrip()}\n\n{starter}"}]
        prompt = f"{prompt.rstrip()}\n\n{starter}"
    return prompt


def _nonempty_str(value: Any, key: str, schema: str) -> str:
    if not isinstance(value, str):
        raise RecordError(f"'{key}' is {_kind(value)}, expected a string ({_NEEDS[schema]})")
    if not value.strip():
        raise RecordError(f"'{key}' is empty ({_NEEDS[schema]})")
    return value


def _render(messages: Any, key: str, chat_template: ChatTemplate | None) -> str | list[dict[str, str]]:
    """A chat-message list as the prompt: the template's rendering, else the messages themselves (their role and
    content), which the generator renders in its model's chat template, or joins for a model without one."""
    if not isinstance(messages, list) or not messages:
        raise RecordError(f"'{key}' must be a non-empty list of {{'role': ..., 'content': ...}}")
    for i, message in enumerate(messages):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise RecordError(f"'{key}'[{i}] must be {{'role': str, 'content': str}}, got {message!r:.80}")
    if chat_template is None:
        return [{"role": m["role"], "content": m["content"]} for m in messages]
    try:
        rendered = chat_template(messages)
    except Exception as exc:  # a template that rejects one record (e.g. role order) must not stop the stream
        raise RecordError(f"chat_template failed on '{key}': {type(exc).__name__}: {exc}") from exc
    if not isinstance(rendered, str):
        raise RecordError(f"chat_template returned {_kind(rendered)}, expected a string")
    return rendered


def _tests(record: dict[str, Any]) -> dict[str, Any]:
    source: dict[str, Any] = record
    if "inputs" not in record and "outputs" not in record:
        if "input_output" in record:
            source = _decode_input_output(record["input_output"], "'input_output'")
        elif VERL_KEY in record:
            source = _decode_input_output(_ground_truth(record), "'reward_model.ground_truth'")
    for key in ("inputs", "outputs"):
        if key not in source:
            raise RecordError(f"missing '{key}' ({_NEEDS['code']})")
        if not isinstance(source[key], list):
            raise RecordError(f"'{key}' is {_kind(source[key])}, expected a list")
    inputs, outputs = source["inputs"], source["outputs"]
    if not inputs:
        raise RecordError("'inputs' is empty: a code task needs at least one test")
    if len(inputs) != len(outputs):
        raise RecordError(f"'inputs' has {len(inputs)} items but 'outputs' has {len(outputs)}")
    fn_name = source.get("fn_name")
    if fn_name is None:
        for key, values in (("inputs", inputs), ("outputs", outputs)):
            for i, value in enumerate(values):
                if not isinstance(value, str):
                    raise RecordError(f"'{key}'[{i}] is {_kind(value)}; a stdin/stdout test's {key} are strings "
                                      "(give 'fn_name' for function-call tests)")
        return {"kind": "stdio", "inputs": inputs, "outputs": outputs}
    if not isinstance(fn_name, str) or not fn_name.isidentifier():
        raise RecordError(f"'fn_name' is {fn_name!r:.40}, expected a Python function name")
    for i, args in enumerate(inputs):
        if not isinstance(args, list):
            raise RecordError(f"'inputs'[{i}] is {_kind(args)}; a function-call test's input is its argument list")
    return {"kind": "call", "fn_name": fn_name, "inputs": inputs, "outputs": outputs}


def _decode_input_output(value: Any, where: str) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise RecordError(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise RecordError(f"{where} holds {_kind(value)}, expected an object with inputs and outputs")
    return value


def _ground_truth(record: dict[str, Any]) -> Any:
    """verl's `reward_model.ground_truth`: a final answer, or a code task's tests as JSON."""
    holder = record[VERL_KEY]
    if not isinstance(holder, dict) or "ground_truth" not in holder:
        raise RecordError(f"'{VERL_KEY}' is {_kind(holder)} without 'ground_truth', expected verl's "
                          "{'style': ..., 'ground_truth': ...}")
    return holder["ground_truth"]


def _answer(record: dict[str, Any]) -> str:
    if "answer" in record:
        key, value = "answer", record["answer"]
    elif VERL_KEY in record:
        key, value = "reward_model.ground_truth", _ground_truth(record)
    elif "solution" in record:
        key, value = "solution", record["solution"]
    else:
        raise RecordError(f"missing 'answer' (or 'solution', or verl's 'reward_model') ({_NEEDS['math']})")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return _nonempty_str(value, key, "math")

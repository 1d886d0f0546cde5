"""One chat record as a `Conversation`: the fields data=chat accepts, their types, and a refusal
(`BadRecord`, naming the record's key) for anything else, so nothing a user wrote is dropped.

A record is `{"messages": [...], "tools": [...]}` (the field is data.messages_field; `tools`
optional), or `{"prompt": "...", "completion": "..."}` (one user turn, one assistant turn). A
message is an object with:
- `role`: system, user, assistant or tool (a tool's result, answering the assistant's calls);
- `content`: a string (an assistant turn with `tool_calls` may give null or leave it out: "");
- on an assistant turn only: `reasoning_content` (a string: its thinking) and `tool_calls` (a list
  of `{"type": "function", "function": {"name", "arguments"}}` or `{"name", "arguments"}`, the
  arguments an object or a JSON string), the formats Qwen3's chat template renders.
Every field reaches the chat template (`qwen3exp.data.chat.render`), which must render it: one it
does not (a reasoning Qwen3 drops from an older turn, a tool call's id, a tool role the template
has no place for) is refused there. Any other key, of the record or of a message, is refused here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ROLES = ("system", "user", "assistant", "tool")
MESSAGE_KEYS = ("role", "content", "reasoning_content", "tool_calls")
"""A message's keys (reasoning_content and tool_calls: assistant turns only)."""
ASSISTANT_ONLY = ("reasoning_content", "tool_calls")


@dataclass(frozen=True)
class BadRecord(Exception):
    """A record the chat loader cannot use: `key` is the record's own key (`messages[2].role`), or
    the experiment key to blame when `config_key` is set (data.messages_field, data.loss_on)."""

    key: str
    message: str
    config_key: str | None = None


@dataclass(frozen=True)
class Conversation:
    """A record's messages (each a dict of `MESSAGE_KEYS`) and its tools (None: none given)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    messages_field: str = "messages"
    """The record's key of the messages (data.messages_field), for the refusals' names."""
    extras: tuple[str, ...] = ()
    """The keys beyond role and content the record gives (`messages[3].reasoning_content`, `tools`):
    each must change the template's rendering."""


def conversation_of(record: dict, field: str = "messages") -> Conversation:
    """The record's conversation, or BadRecord naming what is wrong with it."""
    if field in record:
        unknown = [k for k in record if k not in (field, "tools")]
        if unknown:
            raise BadRecord(
                unknown[0], f"is not a field of a chat record (the record's fields: {field!r} and optionally 'tools')"
            )
        messages, tools = record[field], record.get("tools")
    elif "prompt" in record and "completion" in record:
        unknown = [k for k in record if k not in ("prompt", "completion")]
        if unknown:
            raise BadRecord(unknown[0], "is not a field of a prompt/completion record (prompt, completion)")
        messages, tools = (
            [{"role": "user", "content": record["prompt"]}, {"role": "assistant", "content": record["completion"]}],
            None,
        )
    else:
        raise BadRecord(
            field, f"has no {field!r} (nor prompt/completion); its keys: {sorted(record)}", "data.messages_field"
        )
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise BadRecord("tools", "is not a list of tool (function) descriptions, each an object")
    checked = _checked(messages, field)
    extras = tuple(f"{field}[{i}].{k}" for i, m in enumerate(checked) for k in ASSISTANT_ONLY if k in m)
    extras += tuple(f"{field}[{i}]" for i, m in enumerate(checked) if m["role"] == "tool")
    return Conversation(checked, tools or None, field, extras + (("tools",) if tools else ()))


def _checked(messages: Any, field: str) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise BadRecord(field, "is not a non-empty list of {role, content} objects")
    out = [_message(m, f"{field}[{i}]") for i, m in enumerate(messages)]
    if not any(m["role"] == "assistant" for m in out):
        raise BadRecord(field, "has no assistant turn")
    return out


def _message(m: Any, key: str) -> dict[str, Any]:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise BadRecord(key, "is not an object with string role and content")
    if m["role"] not in ROLES:
        raise BadRecord(f"{key}.role", f"is {m['role']!r}, not one of {', '.join(ROLES)}")
    for k in m:
        if k not in MESSAGE_KEYS:
            raise BadRecord(f"{key}.{k}", f"is not a field of a message ({', '.join(MESSAGE_KEYS)})")
        if k in ASSISTANT_ONLY and m["role"] != "assistant":
            raise BadRecord(f"{key}.{k}", f"is on a {m['role']} message: only an assistant turn has one")
    calls = m.get("tool_calls")
    content = m.get("content")
    if content is None and calls:
        content = ""  # an assistant turn that only calls tools (OpenAI's format writes null)
    if not isinstance(content, str):
        raise BadRecord(key, "is not an object with string role and content")
    out: dict[str, Any] = {"role": m["role"], "content": content}
    if "reasoning_content" in m:
        if not isinstance(m["reasoning_content"], str):
            raise BadRecord(f"{key}.reasoning_content", "is not a string")
        out["reasoning_content"] = m["reasoning_content"]
    if calls is not None:
        out["tool_calls"] = _calls(calls, f"{key}.tool_calls")
    if m["role"] == "assistant" and not (content.strip() or out.get("reasoning_content", "").strip() or calls):
        raise BadRecord(f"{key}.content", "is an empty assistant turn")
    return out


def _calls(calls: Any, key: str) -> list[dict[str, Any]]:
    """An assistant turn's tool calls, each `{"type": "function", "function": {name, arguments}}` or
    `{name, arguments}`: a name (string) and arguments (an object, or a string of JSON)."""
    if not isinstance(calls, list) or not calls:
        raise BadRecord(key, "is not a non-empty list of tool calls")
    for j, call in enumerate(calls):
        where = f"{key}[{j}]"
        if not isinstance(call, dict):
            raise BadRecord(where, "is not an object")
        allowed = ("type", "function") if "function" in call else ("name", "arguments")
        if unknown := [k for k in call if k not in allowed]:
            raise BadRecord(f"{where}.{unknown[0]}", f"is not a field of a tool call ({', '.join(allowed)})")
        fn = call.get("function", call)
        if "function" in call:
            if call.get("type", "function") != "function":
                raise BadRecord(f"{where}.type", f"is {call['type']!r}, not 'function'")
            if not isinstance(fn, dict):
                raise BadRecord(f"{where}.function", "is not an object {name, arguments}")
            where = f"{where}.function"
            if unknown := [k for k in fn if k not in ("name", "arguments")]:
                raise BadRecord(f"{where}.{unknown[0]}", "is not a field of a function call (name, arguments)")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRecord(f"{where}.name", "is not a non-empty string")
        if not isinstance(fn.get("arguments"), dict | str):
            raise BadRecord(f"{where}.arguments", "is not an object (or a string of JSON)")
    return calls

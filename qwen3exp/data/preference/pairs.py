"""data=preference: records of a prompt with a chosen and a rejected answer, rendered by the
tokenizer's chat template exactly as chat SFT renders a conversation.

A record (one JSON line) is either
- explicit: `{"prompt", "chosen", "rejected"}`, the prompt a string (one user turn) or a list of
  messages (system, user, earlier assistant turns), `chosen` and `rejected` a string or a list of
  one assistant message (TRL's "conversational preference" format); or
- implicit: `{"chosen", "rejected"}`, both whole conversations (lists of messages) that share their
  prompt: the longest common prefix of messages, after which each has one assistant turn.
Each side is the conversation prompt + [answer], rendered by `qwen3exp.data.chat.render.render` with
loss_on=last_assistant: its counted tokens are the final assistant turn's content and its
end-of-turn token (never the prompt, the role header or Qwen3's empty thinking block), the very
mask chat SFT trains. The messages are checked by chat's own record rules (`conversation_of`).
Refused (`BadRecord`, naming the record's key): a record without chosen or rejected, an unknown
field, an empty answer, chosen identical to rejected, implicit conversations sharing no prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qwen3exp.data.chat.records import BadRecord, conversation_of
from qwen3exp.data.chat.render import Rendered, fit, json_record, render

SIDES = ("chosen", "rejected")


@dataclass(frozen=True)
class Pair:
    prompt: list[dict[str, Any]]
    chosen: dict[str, Any]
    rejected: dict[str, Any]

    def side(self, name: str) -> list[dict[str, Any]]:
        """The whole conversation of one side: the prompt and that answer."""
        return [*self.prompt, self.chosen if name == "chosen" else self.rejected]


def pair_of(line: str | dict[str, Any]) -> Pair:
    """The pair of one JSON line (or of a dataset's row, `qwen3exp.data.preference.source`), or
    BadRecord naming the record's key that is wrong."""
    record = line if isinstance(line, dict) else json_record(line)
    for side in SIDES:
        if side not in record:
            raise BadRecord(side, f"is missing (the record's keys: {sorted(record)})")
    unknown = [k for k in record if k not in ("prompt", *SIDES)]
    if unknown:
        raise BadRecord(unknown[0], "is not a field of a preference record (prompt, chosen, rejected)")
    pair = _explicit(record) if "prompt" in record else _implicit(record)
    for side in SIDES:  # chat's own rules: roles, fields, a non-empty assistant turn
        try:
            conversation_of({"messages": pair.side(side)})
        except BadRecord as e:
            key = e.key.replace("messages", side if "prompt" not in record else "prompt", 1)
            if e.key.startswith(f"messages[{len(pair.prompt)}]"):
                key = side
            raise BadRecord(key, e.message) from None
    if pair.chosen == pair.rejected:
        raise BadRecord("rejected", "is identical to chosen (a pair must prefer one answer over another)")
    return pair


def _messages(value: Any, key: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}] if key == "prompt" else [{"role": "assistant", "content": value}]
    if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        return list(value)
    raise BadRecord(key, "is neither a string nor a non-empty list of messages")


def _answer(record: dict, side: str) -> dict[str, Any]:
    messages = _messages(record[side], side)
    if len(messages) != 1 or messages[0].get("role") != "assistant":
        raise BadRecord(side, "is not one assistant message (a string, or a list of one {role: assistant, content})")
    if not str(messages[0].get("content", "")).strip():
        raise BadRecord(side, "is an empty answer")
    return messages[0]


def _explicit(record: dict) -> Pair:
    return Pair(_messages(record["prompt"], "prompt"), _answer(record, "chosen"), _answer(record, "rejected"))


def _implicit(record: dict) -> Pair:
    chosen, rejected = _messages(record["chosen"], "chosen"), _messages(record["rejected"], "rejected")
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    if n == 0:
        raise BadRecord(
            "chosen", "shares no prompt with rejected (implicit-prompt records start with the same messages)"
        )
    for side, conv in (("chosen", chosen), ("rejected", rejected)):
        if len(conv) != n + 1:
            raise BadRecord(side, f"has {len(conv) - n} messages after the shared prompt, not one assistant answer")
    return _explicit({"prompt": chosen[:n], "chosen": chosen[n:], "rejected": rejected[n:]})


def render_pair(tok, pair: Pair) -> tuple[Rendered, Rendered]:
    """Both sides rendered with chat's mask of the final assistant turn (loss_on=last_assistant)."""
    c, r = (render(tok, pair.side(side), "last_assistant") for side in SIDES)
    return c, r


def fit_pair(sides: tuple[Rendered, Rendered], seq_len: int, policy: str) -> tuple[Rendered, Rendered] | None:
    """Both sides fitted to seq_len (`chat_render.fit`); None: the pair is dropped (a side does not fit)."""
    c, r = (fit(s, seq_len, policy) for s in sides)
    return None if c is None or r is None else (c, r)

"""Conversations rendered by the tokenizer's own chat template, and which of their tokens are trained.

Shared by the pre-launch checks and the plan (`qwen3exp.plan.chat_files`) and by the ranks'
dataset (`qwen3exp.titan.chat_dataset`), so both see the same tokens and the same mask.

A record is one JSON line: `{"messages": [{"role", "content"}, ...]}` (roles system, user, assistant;
the field is data.messages_field), or `{"prompt", "completion"}` (one user turn, one assistant turn).

Which tokens are trained (`loss_on`):
- `assistant`: every assistant turn's content and its end-of-turn token (`<|im_end|>` for Qwen3);
- `last_assistant`: the same for the last assistant turn only;
- `all`: every token of the rendered conversation.
Never trained under `assistant`/`last_assistant`: system and user turns, the role headers
(`<|im_start|>assistant\\n`) and the empty thinking block (`<think>\\n\\n</think>\\n\\n`) the template
inserts. How a turn's content is found: the conversation is rendered again with that turn's
content left empty, and the two renderings are diffed. Rendering prefixes (messages[:k]) does not
work with Qwen3's template: it gives the last assistant turn a thinking block and older ones none,
so the rendering of messages[:k] is no prefix of the whole; and diffing token ids misplaces a
boundary, since a byte-level BPE merges "\\n\\n" before `<|im_end|>` but not before text. The diff is
taken on the text and mapped to tokens by their character offsets: a token that overlaps the
content is trained, and so is the first token after it (the end-of-turn token).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

ROLES = ("system", "user", "assistant")
LOSS_ON = ("assistant", "last_assistant", "all")
T = TypeVar("T")


@dataclass(frozen=True)
class Rendered:
    """One conversation: its token ids and, per token, whether the loss trains it."""

    ids: list[int]
    trained: list[bool]


@dataclass(frozen=True)
class BadRecord(Exception):
    """A record the chat loader cannot use: `key` is the record's own key (`messages[2].role`), or
    the experiment key to blame when `config_key` is set (data.messages_field, data.loss_on)."""

    key: str
    message: str
    config_key: str | None = None


def chat_files(path: str | Path) -> list[Path]:
    """The .jsonl files of data.path (the file itself, or a folder's .jsonl files, recursively, sorted)."""
    p = Path(path)
    if p.is_file():
        return [p]
    return sorted(f for f in p.rglob("*.jsonl") if f.is_file())


def records(path: str | Path, limit: int | None = None) -> Iterator[tuple[Path, int, str]]:
    """(file, line number, line) of each non-blank line of data.path's files, in order; at most `limit`."""
    n = 0
    for f in chat_files(path):
        with f.open(encoding="utf-8") as fh:
            for i, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                if limit is not None and n >= limit:
                    return
                n += 1
                yield f, i, line


def messages_of(line: str, field: str = "messages") -> list[dict[str, str]]:
    """A record's conversation, or BadRecord naming what is wrong with it."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadRecord("(line)", f"is not JSON ({e.msg})") from None
    if not isinstance(record, dict):
        raise BadRecord("(line)", f"is a JSON {type(record).__name__}, not an object")
    if field in record:
        messages = record[field]
    elif "prompt" in record and "completion" in record:
        messages = [
            {"role": "user", "content": record["prompt"]},
            {"role": "assistant", "content": record["completion"]},
        ]
    else:
        raise BadRecord(
            field, f"has no {field!r} (nor prompt/completion); its keys: {sorted(record)}", "data.messages_field"
        )
    return _checked(messages, field)


def _checked(messages: Any, field: str) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise BadRecord(field, "is not a non-empty list of {role, content} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise BadRecord(f"{field}[{i}]", "is not an object with string role and content")
        if m["role"] not in ROLES:
            raise BadRecord(f"{field}[{i}].role", f"is {m['role']!r}, not one of {', '.join(ROLES)}")
        if m["role"] == "assistant" and not m["content"].strip():
            raise BadRecord(f"{field}[{i}].content", "is an empty assistant turn")
    if not any(m["role"] == "assistant" for m in messages):
        raise BadRecord(field, "has no assistant turn")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def load_tokenizer(folder: str | Path):
    """The transformers tokenizer of `folder` (the run's hf_assets_path); ValueError when it has no
    chat template."""
    from transformers import AutoTokenizer  # lazy: heavy; only where conversations are rendered

    tok = AutoTokenizer.from_pretrained(str(folder))
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"the tokenizer in {folder} has no chat template (tokenizer_config.json: chat_template)")
    return tok


def render(tok, messages: list[dict[str, str]], loss_on: str = "assistant") -> Rendered:
    """The conversation's token ids and trained mask (see the module docstring). BadRecord when
    `loss_on` trains no token of it."""
    text = tok.apply_chat_template(messages, tokenize=False)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    if loss_on == "all":
        return Rendered(ids, [True] * len(ids))
    turns = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    if loss_on == "last_assistant":
        turns = turns[-1:]
    trained = [False] * len(ids)
    for k in turns:
        start, end = _content_span(tok, messages, k, text)
        after = [i for i, (s, e) in enumerate(offsets) if s >= end and e > s]
        for i, (s, e) in enumerate(offsets):
            trained[i] = trained[i] or (s < end and e > start)
        if after:
            trained[after[0]] = True  # the end-of-turn token
    if not any(trained):
        raise BadRecord("messages", f"has no token to train for loss_on={loss_on}", "data.loss_on")
    return Rendered(ids, trained)


def fit(r: Rendered, seq_len: int, policy: str) -> Rendered | None:
    """The conversation as one training sequence of `seq_len` inputs (seq_len + 1 tokens: inputs and
    next-token labels). Longer: None (policy "drop") or its first seq_len + 1 tokens ("truncate");
    None as well when what is left trains no label."""
    if len(r.ids) <= seq_len + 1:
        return r
    if policy == "drop":
        return None
    cut = Rendered(r.ids[: seq_len + 1], r.trained[: seq_len + 1])
    return cut if any(cut.trained[1:]) else None


def packs(items: Iterable[T], size: Callable[[T], int], capacity: int) -> Iterator[list[T]]:
    """data.pack: the items in order, greedily in groups whose sizes sum to at most `capacity`; an
    item that does not fit in what is left of the current group starts the next one (each item's
    size is at most `capacity`: `fit` made it so). The ranks' dataset packs conversations with it
    and the plan counts the sequences with it, so both pack alike."""
    group: list[T] = []
    used = 0
    for item in items:
        n = size(item)
        if group and used + n > capacity:
            yield group
            group, used = [], 0
        group.append(item)
        used += n
    if group:
        yield group


def _content_span(tok, messages: list[dict[str, str]], k: int, text: str) -> tuple[int, int]:
    """Where assistant turn k's content lies in `text` (characters [start, end))."""
    blank = [*messages[:k], {"role": "assistant", "content": ""}, *messages[k + 1 :]]
    t0 = tok.apply_chat_template(blank, tokenize=False)
    n = len(text) - len(t0)
    if n <= 0:
        raise BadRecord(f"messages[{k}].content", "does not appear in the chat template's rendering")
    cp = _common_prefix(text, t0)
    cs = _common_suffix(text, t0)
    lo, hi = max(0, len(t0) - cs), min(cp, len(t0))
    if lo > hi:  # not one insertion (the template moved part of it, e.g. a thinking block): all of the change
        return cp, len(text) - min(cs, len(t0) - cp)
    # Where the content begins is ambiguous by the characters it shares with its neighbours (content
    # ending in "\n" after a header ending in "\n"): prefer where the text is the content itself.
    content = messages[k]["content"]
    for q in range(hi, lo - 1, -1):
        if text[q : q + n] == content:
            return q, q + n
    return hi, hi + n


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _common_suffix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[-1 - i] == b[-1 - i]:
        i += 1
    return i

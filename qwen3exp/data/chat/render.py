"""Conversations rendered by the tokenizer's own chat template, and which of their tokens are trained.

Shared by the pre-launch checks and the plan (`qwen3exp.data.chat.files`) and by the ranks'
dataset (`qwen3exp.titan.chat_dataset`), so both see the same tokens and the same mask.

A record is one JSON line (`qwen3exp.data.chat.records`: the fields, their types): `{"messages":
[...], "tools": [...]}` (roles system, user, assistant, tool; an assistant turn may carry
`reasoning_content` and `tool_calls`; the field is data.messages_field), or `{"prompt",
"completion"}`. The messages go to the template with all their fields and the tools as its `tools`,
so the tokens are what `tok.apply_chat_template(messages, tools=tools)` gives. A field the template
does not render (the conversation renders the same without it) is refused (`BadRecord`), never
dropped: Qwen3's template drops the reasoning of assistant turns before the last user message.

Which tokens are trained (`loss_on`):
- `assistant`: every assistant turn as the model writes it: its reasoning (from `<think>` to
  `</think>`), content and tool calls, and its end-of-turn token (`<|im_end|>` for Qwen3);
- `last_assistant`: the same for the last assistant turn only;
- `all`: every token of the rendered conversation (the tools, tool results and user turns too).
Never trained under `assistant`/`last_assistant`: system, user and tool turns (tool results), the
tools the system turn lists, the role headers (`<|im_start|>assistant\\n`) and the empty thinking
block (`<think>\\n\\n</think>\\n\\n`) the template inserts where a turn has no reasoning. How a
turn is found: the conversation is rendered again with that turn's content, reasoning and tool
calls left out, and the two renderings are diffed. Rendering prefixes (messages[:k]) does not
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
from typing import TypeVar

from qwen3exp.data.chat.records import BadRecord, Conversation, conversation_of

LOSS_ON = ("assistant", "last_assistant", "all")
T = TypeVar("T")


@dataclass(frozen=True)
class Rendered:
    """One conversation: its token ids and, per token, whether the loss trains it."""

    ids: list[int]
    trained: list[bool]


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


def json_record(line: str) -> dict:
    """One JSON-lines record, or BadRecord saying why the line is none."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadRecord("(line)", f"is not JSON ({e.msg})") from None
    if not isinstance(record, dict):
        raise BadRecord("(line)", f"is a JSON {type(record).__name__}, not an object")
    return record


def messages_of(line: str, field: str = "messages") -> Conversation:
    """A record's conversation (`qwen3exp.data.chat.records`), or BadRecord naming what is wrong with it."""
    return conversation_of(json_record(line), field)


def load_tokenizer(folder: str | Path):
    """The transformers tokenizer of `folder` (the run's hf_assets_path); ValueError when it has no
    chat template."""
    from transformers import AutoTokenizer  # lazy: heavy; only where conversations are rendered

    tok = AutoTokenizer.from_pretrained(str(folder))
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"the tokenizer in {folder} has no chat template (tokenizer_config.json: chat_template)")
    return tok


def template_text(tok, conv: Conversation | list[dict], messages: list[dict] | None = None, tools=False) -> str:
    """The chat template's rendering of `conv` (or of `messages` and `tools` in its place): the
    messages with all their fields, the tools as the template's `tools`. BadRecord when the template
    fails on it (its own `raise_exception`, a field of a type it cannot render)."""
    conv = conv if isinstance(conv, Conversation) else Conversation(list(conv))
    try:
        return tok.apply_chat_template(
            conv.messages if messages is None else messages,
            tools=conv.tools if tools is False else tools,
            tokenize=False,
        )
    except Exception as e:  # the template is the tokenizer's code run on the record: any failure is the record's
        raise BadRecord(conv.messages_field, f"fails in the chat template ({type(e).__name__}: {e})") from None


def render(tok, conv: Conversation | list[dict], loss_on: str = "assistant") -> Rendered:
    """The conversation's token ids and trained mask (see the module docstring). BadRecord when
    `loss_on` trains no token of it, or the template leaves out a field the record gives."""
    conv = conv if isinstance(conv, Conversation) else Conversation(list(conv))
    text = template_text(tok, conv)
    for extra in conv.extras:
        _check_rendered(tok, conv, extra, text)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    if loss_on == "all":
        return Rendered(ids, [True] * len(ids))
    turns = [k for k, m in enumerate(conv.messages) if m["role"] == "assistant"]
    if loss_on == "last_assistant":
        turns = turns[-1:]
    trained = [False] * len(ids)
    for k in turns:
        start, end = _turn_span(tok, conv, k, text)
        after = [i for i, (s, e) in enumerate(offsets) if s >= end and e > s]
        for i, (s, e) in enumerate(offsets):
            trained[i] = trained[i] or (s < end and e > start)
        if after:
            trained[after[0]] = True  # the end-of-turn token
    if not any(trained):
        raise BadRecord(conv.messages_field, f"has no token to train for loss_on={loss_on}", "data.loss_on")
    return Rendered(ids, trained)


def _check_rendered(tok, conv: Conversation, extra: str, text: str) -> None:
    """BadRecord when the conversation renders the same without `extra` (`tools`, a tool message
    `messages[3]`, or a message's field `messages[2].reasoning_content`): the template drops it."""
    messages, tools = conv.messages, conv.tools
    if extra == "tools":
        tools = None
    else:
        index, _, key = extra[len(conv.messages_field) + 1 :].partition("].")
        k = int(index.rstrip("]"))
        if key:
            messages = [*messages[:k], {f: v for f, v in messages[k].items() if f != key}, *messages[k + 1 :]]
        else:
            messages = [*messages[:k], *messages[k + 1 :]]
    try:
        same = template_text(tok, conv, messages, tools) == text
    except BadRecord:
        same = False  # the template needs it
    if same:
        hint = "use a tokenizer whose chat template renders it (Qwen3's own renders reasoning_content, tool_calls, "
        hint += "tool messages and tools; the bundled tokenizer's none of them), or remove it"
        if extra.endswith("reasoning_content"):
            hint = (
                "Qwen3's own template renders the reasoning of the assistant turns after the last user message only "
                "(the bundled tokenizer's none): give the earlier turns a record of their own, or remove it"
            )
        raise BadRecord(extra, f"is not rendered by the chat template, so it would be dropped without a word; {hint}")


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


THINK = "<think>"
"""Where an assistant turn's reasoning starts (Qwen3): trained with it."""
SENTINEL = "\x00"
"""The content of the turn left out: a character no template writes next to a turn, so the diff
ends exactly where the turn's own text does (an empty turn shares the `<` of `<|im_end|>` with a
`<think>` or `<tool_call>`, and the newline of a header with content that starts with one)."""


def _turn_span(tok, conv: Conversation, k: int, text: str) -> tuple[int, int]:
    """Where assistant turn k (its reasoning, content and tool calls) lies in `text` ([start, end))."""
    messages, m = conv.messages, conv.messages[k]
    blank = [*messages[:k], {"role": "assistant", "content": SENTINEL}, *messages[k + 1 :]]
    t0 = template_text(tok, conv, blank)
    start = _common_prefix(text, t0)
    end = len(text) - min(_common_suffix(text, t0), len(t0) - start, len(text) - start)
    if end <= start:
        raise BadRecord(f"{conv.messages_field}[{k}].content", "does not appear in the chat template's rendering")
    head = text[:start].rstrip()
    if m.get("reasoning_content") and head.endswith(THINK):
        start = len(head) - len(THINK)  # the turn's own thinking block opens with its reasoning
    return start, end


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

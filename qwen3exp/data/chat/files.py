"""Pre-launch checks of data=chat, and what the plan shows of it.

Before any worker starts, the conversations are read and rendered as the ranks will render them
(`qwen3exp.data.chat.render`, the run's own tokenizer and chat template), and every record the
loader would refuse is a problem naming the file, the line and the record's key: not JSON, no
`messages` (nor prompt/completion), an unknown field or role, no assistant turn, an empty assistant
turn, a field the chat template does not render (`chat_render`: it would be dropped), no token to
train for data.loss_on. A tokenizer without a chat template is refused as well, and a
held-out split that leaves a side empty. Bounded: the first `MAX_CHECKED` conversations are
rendered (all of a small file); the conversations are counted in files up to `COUNT_BYTES`.

The plan shows: conversations, tokens, trained tokens (% of the conversations' tokens), and how
many conversations training.seq_len drops or truncates (data.max_len_policy).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from qwen3exp.config.sections.data import ChatData
from qwen3exp.data.chat.render import BadRecord, chat_files, fit, load_tokenizer, messages_of, records, render
from qwen3exp.data.files import COUNT_BYTES, fraction_problems
from qwen3exp.errors import Problem, nearby_path

MAX_CHECKED = 2000
"""Conversations rendered before launch (the first ones, in the loader's order)."""
MAX_REPORTED = 5
"""Bad records reported one by one before the rest are counted."""
_ALLOWED = (
    'JSON lines, each {"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "..."}, ...], '
    '"tools": [...]} with at least one non-empty assistant turn (which may add "reasoning_content" and '
    '"tool_calls"), or {"prompt": "...", "completion": "..."}; every field rendered by the chat template'
)


@dataclass(frozen=True)
class ChatStats:
    """The first `checked` conversations, rendered and fitted to training.seq_len."""

    checked: int
    total: int | None
    """Conversations in data.path (None: not counted, the files are too large)."""
    tokens: int
    """Tokens of the conversations that are trained on (after dropping and truncating)."""
    trained: int
    """Of those, the tokens the loss trains."""
    dropped: int
    truncated: int


def chat_problems(data, validation, tokenizer_folder: Path | None, seq_len: int | None = None) -> list[Problem]:
    """Every problem of data.path (and validation.path) for data=chat (none for other data);
    `tokenizer_folder` None: the model's files did not check out, so only the records' structure
    is checked."""
    if not isinstance(data, ChatData):
        return []
    problems = _path_problems("data.path", data.location)
    if validation is not None and validation.enable and validation.path is not None:
        problems += _path_problems("validation.path", validation.path)
    if problems:
        return problems
    tok = None
    if tokenizer_folder is not None:
        try:
            tok = load_tokenizer(tokenizer_folder)
        except ValueError as e:
            return [
                Problem(
                    "data.source",
                    "chat",
                    str(e),
                    "a tokenizer with a chat template (the model's, or the bundled one)",
                    "use the tokenizer of a chat model (its tokenizer_config.json has chat_template)",
                )
            ]
    problems += _record_problems("data.path", data, (tok, tokenizer_folder), seq_len)
    if validation is not None and validation.enable and validation.path is not None:
        val = data.model_copy(update={"path": validation.path})
        problems += _record_problems("validation.path", val, (tok, tokenizer_folder), None)
    elif validation is not None and validation.held_out is not None and not problems:
        problems += _split_problems(
            data.location, validation.fraction, "data.path" if data.path else "the bundled chat data"
        )
    return problems


def _path_problems(key: str, value: str) -> list[Problem]:
    path, allowed = Path(value), "an existing .jsonl file or a folder holding .jsonl files"
    if not path.exists():
        return [Problem(key, value, "does not exist", allowed, nearby_path(path))]
    if path.is_file() and path.suffix != ".jsonl":
        return [Problem(key, value, f"unsupported file type {path.suffix or '(none)'}", allowed)]
    if not chat_files(path):
        return [Problem(key, value, "the folder holds no .jsonl file", allowed)]
    return []


def _record_problems(key: str, data, tokenizer: tuple, seq_len: int | None) -> list[Problem]:
    """The first records of data.path; `tokenizer`: (the tokenizer or None, its folder)."""
    (tok, folder), root = tokenizer, Path(data.location)
    out: list[Problem] = []
    bad = 0
    for f, line_no, line in records(data.location, MAX_CHECKED):
        try:
            messages = messages_of(line, data.messages_field)
            if tok is not None:
                render(tok, messages, data.loss_on)
        except BadRecord as e:
            bad += 1
            if len(out) < MAX_REPORTED:
                shown = str(f.relative_to(root)) if root.is_dir() else f.name
                ck = e.config_key
                value = getattr(data, ck.split(".")[1]) if ck else data.location
                out.append(Problem(ck or key, value, f"{shown} line {line_no}: {e.key} {e.message}", _ALLOWED))
        except UnicodeDecodeError as e:
            return [Problem(key, data.location, f"{f.name} is not UTF-8 ({e.reason})", _ALLOWED)]
    if bad > len(out):
        last = out[-1]
        out[-1] = Problem(last.key, last.value, f"{last.message} (and {bad - len(out)} more bad record(s))", _ALLOWED)
    if not out and tok is not None and seq_len is not None:
        s = stats(data, folder, seq_len)
        if s.checked and s.dropped == s.checked:
            out.append(
                Problem(
                    "training.seq_len",
                    seq_len,
                    f"every one of the first {s.checked} conversations is longer than seq_len + 1 tokens and "
                    "data.max_len_policy=drop drops it",
                    "a seq_len that fits the conversations",
                    "raise training.seq_len, or data.max_len_policy=truncate",
                )
            )
    return out


def conversation_count(path: str | Path) -> int | None:
    """Non-blank lines of data.path's files (None: more than COUNT_BYTES)."""
    files = chat_files(path)
    try:
        if sum(f.stat().st_size for f in files) > COUNT_BYTES:
            return None
    except OSError:
        return None
    return sum(1 for _ in records(path))


def _split_problems(path: str, fraction: float, of: str) -> list[Problem]:
    n = conversation_count(path)
    return [] if n is None else fraction_problems(n, fraction, "conversation", of)


def stats(data, tokenizer_folder: str | Path, seq_len: int) -> ChatStats:
    """The plan's figures for data=chat (cached per data set as it is on disk)."""
    files = chat_files(data.location)
    stamp = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    key = (data.location, data.messages_field, data.loss_on, data.max_len_policy)
    return _stats(key, str(tokenizer_folder), seq_len, stamp)


@functools.lru_cache(maxsize=16)
def _stats(key: tuple, tokenizer_folder: str, seq_len: int, _stamp: tuple) -> ChatStats:
    path, field, loss_on, policy = key
    tok = load_tokenizer(tokenizer_folder)
    checked = tokens = trained = dropped = truncated = 0
    for _, _, line in records(path, MAX_CHECKED):
        checked += 1
        r = render(tok, messages_of(line, field), loss_on)
        f = fit(r, seq_len, policy)
        if f is None:
            dropped += 1
            continue
        truncated += len(f.ids) < len(r.ids)
        tokens += len(f.ids) - 1
        trained += sum(f.trained[1:])
    return ChatStats(checked, conversation_count(path), tokens, trained, dropped, truncated)


def epochs(s: ChatStats, sequences: int, held_out: float | None) -> float | None:
    """Passes over the training conversations that `sequences` (global batch x training.steps) make: one
    conversation per sequence; None when the conversations are not counted."""
    if s.total is None or not s.checked:
        return None
    kept = s.total * (s.checked - s.dropped) / s.checked * (1 - (held_out or 0.0))
    return sequences / kept if kept else None


def plan_lines(exp, tokenizer_folder: Path, global_batch_size: int | None = None) -> list[str]:
    """The plan's lines about data=chat (none for other data); with the global batch, the epochs."""
    d, seq_len = exp.data, exp.training.seq_len
    if d.source != "chat":
        return []
    s = stats(d, tokenizer_folder, seq_len)
    total = f"{s.total:,}" if s.total is not None else "?"
    of = f"the first {s.checked:,} of {total}" if s.total != s.checked else f"{s.checked:,}"
    share = f"{s.trained / s.tokens:.1%}" if s.tokens else "-"
    kept = s.checked - s.dropped
    padding = 1 - s.tokens / (kept * seq_len) if kept else 0.0
    layout = "packed (data.pack=true; below)" if d.pack else f"one conversation per sequence, {padding:.0%} padding"
    return [
        f"chat data:  {of} conversations: {s.tokens:,} tokens, {s.trained:,} trained ({share}; "
        f"data.loss_on={d.loss_on}); {layout}",
        f"            at seq_len {seq_len}: {s.dropped} dropped, {s.truncated} truncated "
        f"(data.max_len_policy={d.max_len_policy})"
        + (f"; {_epochs_text(s, exp, global_batch_size)}" if global_batch_size and not d.pack else ""),
    ]


def _epochs_text(s: ChatStats, exp, global_batch_size: int) -> str:
    steps = exp.training.steps
    ep = epochs(s, global_batch_size * steps, exp.validation.held_out)
    shown = "? epochs (conversations not counted)" if ep is None else f"{ep:.3g} epoch(s)"
    return f"{steps} steps x {global_batch_size} conversations = {shown}"

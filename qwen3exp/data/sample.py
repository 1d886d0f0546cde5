"""The first training samples of an experiment's data as the ranks read them, and which of their
tokens the loss trains: what `qwen3exp data show` and a dry run print (`qwen3exp.data.marks`
marks them).

- data=chat: the conversations of data.path in file order (the first epoch's order), rendered by the
  run's tokenizer and chat template and fitted to training.seq_len by the ranks' own code
  (`chat_render.render` and `fit`). A token is trained when data.loss_on flags it and it is not the
  sequence's first token (nothing before it predicts that one).
- Plain text (bundled, local, hf): the documents in the loader's order, each encoded as torchtitan
  0.3.0's text dataset encodes it (`encode(text, add_bos=True, add_eos=True)`): a BOS token first
  when the tokenizer has one, the text, then the separator (data.eos, `data_figures.separator`).
  Labels are shifted within a document, so every token but the document's first is trained.

Training's side of the held-out split: what validation holds out (validation.fraction) is skipped,
as the ranks skip it, where the documents are counted before loading (else `Samples.skipped` says
so). At most `MAX_READ` records are read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from qwen3exp.assets import CORPUS_DIR
from qwen3exp.config.sections.data import ChatData, PreferenceData
from qwen3exp.data.chat.files import MAX_CHECKED, conversation_count
from qwen3exp.data.chat.render import fit, load_tokenizer, messages_of, records, render
from qwen3exp.data.figures import separator
from qwen3exp.data.files import COUNT_BYTES, data_files, document_count, held_out
from qwen3exp.data.preference import source as pair_source
from qwen3exp.data.preference.pairs import SIDES, fit_pair, pair_of, render_pair
from qwen3exp.data.text.hf_files import is_held_out, read_heads
from qwen3exp.data.text.hf_source import resolve
from qwen3exp.units import MIB

MAX_READ = MAX_CHECKED
"""Records read at most (the ones the pre-launch checks rendered)."""
READ_BYTES = 4 * MIB
"""Text read from a .txt or JSON array file at most."""
_LEGEND = {
    "assistant": "each assistant turn (reasoning, content, tool calls) and its end-of-turn token "
    "(data.loss_on=assistant)",
    "last_assistant": "the last assistant turn (reasoning, content, tool calls) and its end-of-turn token "
    "(data.loss_on=last_assistant)",
    "all": "every token but the first (data.loss_on=all)",
}


@dataclass(frozen=True)
class Sample:
    label: str
    """Where it comes from: `conversation 2 (train.jsonl line 2)`."""
    pieces: tuple[tuple[str, bool], ...]
    """Its text, in runs of trained (True) and untrained (False) tokens."""
    tokens: int
    trained: int
    note: str = ""
    """What fitting to training.seq_len did to it."""


@dataclass(frozen=True)
class Samples:
    source: str
    """The data, in words (`data=chat: /data/chats.jsonl`)."""
    trained: str
    """What the loss trains, in words."""
    samples: list[Sample]
    skipped: list[str] = field(default_factory=list)
    """What was passed over before or between the samples (held out, dropped), in words."""


def first_samples(exp, folder: str | Path, count: int) -> Samples:
    """The first `count` training samples of `exp` (`folder`: the run's tokenizer, as the plan
    found it). Raises what reading the data raises (OSError, ValueError, chat_render.BadRecord)."""
    if isinstance(exp.data, ChatData):
        return _chat(exp, folder, count)
    if isinstance(exp.data, PreferenceData):
        return _pairs(exp, folder, count)
    return _text(exp, folder, count)


def _pairs(exp, folder: str | Path, count: int) -> Samples:
    """data=preference: the first `count` pairs, their chosen and rejected sides each a sample."""
    d, seq_len, tok = exp.data, exp.training.seq_len, load_tokenizer(folder)
    src, problems = pair_source.resolve(d)
    if src is None:
        raise ValueError(problems[0].message)
    skipped: list[str] = []
    held = _held(pair_source.count(src, COUNT_BYTES), exp.validation.held_out, "pairs", skipped)
    out: list[Sample] = []

    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    for i, (f, number, record) in enumerate(pair_source.rows(src, MAX_READ)):
        if len(out) >= 2 * count:
            break
        fitted = None if i in held else fit_pair(render_pair(tok, pair_of(record)), seq_len, d.max_len_policy)
        for side, r in zip(SIDES, fitted or (), strict=False):
            trained = [False, *r.trained[1:]]
            label = f"pair {i + 1}, {side} ({src.place(f, number)})"
            out.append(Sample(label, _pieces(decode, r.ids, trained), len(r.ids), sum(trained)))
    where = pair_source.describe(d)
    return Samples(f"data=preference: {where}", "the final answer and its end-of-turn token", out, skipped)


def _pieces(decode, ids: list[int], trained: list[bool]) -> tuple[tuple[str, bool], ...]:
    """The tokens decoded in runs of equal trained flags."""
    out: list[tuple[str, bool]] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or trained[i] != trained[start]:
            out.append((decode(ids[start:i]), trained[start]))
            start = i
    return tuple(out)


def _held(n: int | None, fraction: float | None, what: str, skipped: list[str]) -> set[int]:
    """The positions validation holds out of n records ({} without a split); `skipped` says when
    they are not known here."""
    if fraction is None:
        return set()
    if n is None:
        skipped.append(
            f"validation holds out {fraction:.0%} of the {what}; too many to count here, so a sample "
            "below may be one of them"
        )
        return set()
    return set(held_out(n, fraction)) if n >= 2 else set()


def _chat(exp, folder: str | Path, count: int) -> Samples:
    d, seq_len = exp.data, exp.training.seq_len
    tok = load_tokenizer(folder)

    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    skipped: list[str] = []
    held = _held(conversation_count(d.location), exp.validation.held_out, "conversations", skipped)
    root, out, n_held, dropped = Path(d.location), list[Sample](), 0, 0
    for i, (f, line_no, line) in enumerate(records(d.location, MAX_READ)):
        if len(out) >= count:
            break
        if i in held:
            n_held += 1
            continue
        r = render(tok, messages_of(line, d.messages_field), d.loss_on)
        fitted = fit(r, seq_len, d.max_len_policy)
        if fitted is None:
            dropped += 1
            continue
        trained = [False, *fitted.trained[1:]]
        note = (
            f"truncated from {len(r.ids)} to seq_len + 1 = {seq_len + 1} tokens (data.max_len_policy=truncate)"
            if len(fitted.ids) < len(r.ids)
            else ""
        )
        shown = f.relative_to(root) if root.is_dir() else f.name
        pieces = _pieces(decode, fitted.ids, trained)
        out.append(
            Sample(f"conversation {i + 1} ({shown} line {line_no})", pieces, len(fitted.ids), sum(trained), note)
        )
    if n_held:
        skipped.append(f"{n_held} conversation(s) held out for validation (validation.fraction)")
    if dropped:
        skipped.append(
            f"{dropped} conversation(s) longer than seq_len + 1 = {seq_len + 1} tokens, dropped "
            "(data.max_len_policy=drop)"
        )
    where = "the bundled conversations" if d.path is None else d.path
    return Samples(f"data=chat: {where}", _LEGEND[d.loss_on], out, skipped)


def _text(exp, folder: str | Path, count: int) -> Samples:
    d, skipped = exp.data, list[str]()
    sep = separator(d, folder)
    if sep is None:
        raise ValueError(f"data.eos {d.eos!r} is not a token of the tokenizer in {folder}")
    tok = _tokenizer(folder)
    bos, empty = _bos(folder, tok), tok.encode("").ids

    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=False)

    out: list[Sample] = []
    for label, text in _documents(d, exp.validation.held_out, count, skipped):
        ids = tok.encode(text).ids
        if bos is not None and bos not in empty:
            ids = [bos, *ids]
        if sep[1] not in empty:
            ids = [*ids, sep[1]]
        flags = [False] + [True] * (len(ids) - 1)
        out.append(Sample(label, _pieces(decode, ids, flags), len(ids), len(ids) - 1))
    trained = f"every token but each document's first; each document ends with {sep[0]} (data.eos)"
    return Samples(f"data={d.source}: {_where(d)}", trained, out, skipped)


def _where(d) -> str:
    if d.source == "bundled":
        return f"the bundled corpus ({CORPUS_DIR})"
    if d.source == "local":
        return d.path
    return d.name if d.name is not None else d.files


def _tokenizer(folder: str | Path):
    from tokenizers import Tokenizer  # lazy: only where text is tokenized

    return Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))


def _bos(folder: str | Path, tok) -> int | None:
    """The id of tokenizer_config.json's bos_token (torchtitan prepends it to every document)."""
    cfg = Path(folder) / "tokenizer_config.json"
    bos = json.loads(cfg.read_text()).get("bos_token") if cfg.is_file() else None
    bos = bos.get("content") if isinstance(bos, dict) else bos
    return tok.token_to_id(bos) if isinstance(bos, str) else None


def _documents(d, fraction: float | None, count: int, skipped: list[str]) -> list[tuple[str, str]]:
    """(label, text) of the first `count` training documents, in the loader's order."""
    if d.source == "hf":
        return _hf_documents(d, fraction, count, skipped)
    path = CORPUS_DIR if d.source == "bundled" else Path(d.path)
    held = _held(document_count(path), fraction, "documents", skipped)
    out: list[tuple[str, str]] = []
    n_held = 0
    for i, (label, text) in enumerate(_file_documents(path, getattr(d, "text_field", "text"))):
        if len(out) >= count or i >= MAX_READ:
            break
        if i in held:
            n_held += 1
        else:
            out.append((f"document {i + 1} ({label})", text))
    if n_held:
        skipped.append(f"{n_held} document(s) held out for validation (validation.fraction)")
    return out


def _file_documents(path: Path, text_field: str) -> Iterator[tuple[str, str]]:
    """(file and line or paragraph, text) of every document of bundled/local data, as `datasets`
    cuts them: a .txt file's non-empty blank-line separated paragraphs, a JSON lines file's lines, a
    JSON array's items."""
    files = [Path(f) for f in data_files(path)]
    plain = all(f.suffix == ".txt" for f in files)
    for f in files:
        shown = f.relative_to(path) if path.is_dir() else f.name
        if plain:
            with open(f, encoding="utf-8") as fh:
                text = fh.read(READ_BYTES)
            paragraphs = [p for p in text.split("\n\n") if p]
            if len(text) == READ_BYTES:
                paragraphs = paragraphs[:-1] or paragraphs  # the last one was cut by the limit
            for k, p in enumerate(paragraphs):
                yield f"{shown} paragraph {k + 1}", p
            continue
        with open(f, encoding="utf-8") as fh:
            head = fh.read(1)
            fh.seek(0)
            if head == "[":
                items = json.loads(fh.read(READ_BYTES))
                for k, item in enumerate(items):
                    yield f"{shown} item {k + 1}", item if isinstance(item, str) else item[text_field]
                continue
            for k, line in enumerate(fh, start=1):
                if line.strip():
                    yield f"{shown} line {k}", json.loads(line)[text_field]


def _hf_documents(d, fraction: float | None, count: int, skipped: list[str]) -> list[tuple[str, str]]:
    """data=hf's first training rows (`hf_data_files.read_heads`: the first rows of its first files).
    A row's position counts the rows of the files before it: read up to the first file not counted."""
    src, _ = resolve(d)
    if src is None:
        return []
    heads, _ = read_heads(src, d.text_field)
    complete = len(heads) == len(src.files) and all(h.rows is not None for h in heads)
    n = sum(h.rows or 0 for h in heads) if complete else None
    held = set() if d.streaming else _held(n, fraction, "rows", skipped)
    out: list[tuple[str, str]] = []
    n_held = offset = 0
    for f, h in zip(src.files, heads, strict=False):
        for k, text in enumerate(h.texts):
            i = offset + k
            if len(out) >= count:
                break
            if i in held or (d.streaming and fraction is not None and is_held_out(i, fraction)):
                n_held += 1
            elif isinstance(text, str):
                out.append((f"row {i + 1} ({Path(f).name} row {k + 1})", text))
        if h.rows is None or len(out) >= count:
            break
        offset += h.rows
    if n_held:
        skipped.append(f"{n_held} row(s) held out for validation (validation.fraction)")
    return out

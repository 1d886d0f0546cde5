"""The document separator of plain-text data (data.eos), and the plan's figures of the data.

The separator: torchtitan's text dataset appends the tokenizer's `eos_id` to every document
(`encode(text, add_eos=True)`); the ranks set that id to the one chosen here
(`qwen3exp.titan.dataset.tokenizer_config`). data.eos null: the model's end-of-text token,
`<|endoftext|>` when the tokenizer has it (Qwen3's hybrid models name `<|im_end|>` their
eos_token, which ends a chat turn, not a document), else the tokenizer's eos_token. The token must
have an id of its own in the run's tokenizer (what `token_to_id` finds): else exit 2 naming data.eos.
Plain JSON: no tokenizers, no transformers.

The figures (shown in the plan, written to plan.json's "data" and summary.json's "data"):
documents (conversations for data=chat), tokens, and the epochs training.steps reads (data.pack:
counted in the sequences the conversations pack into, `chat_packing`). Plain text:
the documents counted (data up to `data_files.COUNT_BYTES`; else estimated from the first ones'
bytes), the tokens of the first `MAX_DOCS` documents (up to `SAMPLE_BYTES`) tokenized with the
run's tokenizer, one separator each, scaled to all documents ("counted" when every document was
tokenized). data=hf: the first rows of its first files (`hf_data_files`), scaled the same way.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from qwen3exp.assets import CORPUS_DIR
from qwen3exp.config.sections.data import ChatData, PreferenceData
from qwen3exp.data.chat import files as chat_files, packing as chat_packing
from qwen3exp.data.files import data_files, document_count
from qwen3exp.data.preference import files as preference_files
from qwen3exp.data.text import hf_files as hf_data_files
from qwen3exp.data.text.hf_source import resolve
from qwen3exp.errors import Problem, did_you_mean
from qwen3exp.units import MIB

END_OF_TEXT = "<|endoftext|>"
MAX_DOCS = 1000
"""Documents tokenized before launch for the plan's token figure (the first ones, in the loader's order)."""
SAMPLE_BYTES = 2 * MIB
"""Text tokenized before launch, at most."""


@functools.lru_cache(maxsize=8)
def _vocab(folder: str) -> dict[str, int]:
    """Every token of the tokenizer in `folder` with an id of its own (its vocabulary and added tokens)."""
    root, ids = Path(folder), dict[str, int]()
    tok = root / "tokenizer.json"
    if tok.is_file():
        data = json.loads(tok.read_text())
        vocab = data.get("model", {}).get("vocab") or {}
        ids.update(vocab if isinstance(vocab, dict) else {v[0]: i for i, v in enumerate(vocab)})
        ids.update({t["content"]: t["id"] for t in data.get("added_tokens") or []})
    elif (root / "vocab.json").is_file():
        ids.update(json.loads((root / "vocab.json").read_text()))
    decoder = _config(folder).get("added_tokens_decoder") or {}
    ids.update({str(t.get("content") if isinstance(t, dict) else t): int(i) for i, t in decoder.items()})
    return ids


def _config(folder: str) -> dict:
    cfg = Path(folder) / "tokenizer_config.json"
    return json.loads(cfg.read_text()) if cfg.is_file() else {}


def tokenizer_eos(folder: str | Path) -> str | None:
    """The tokenizer's own eos_token (tokenizer_config.json): what torchtitan appends unless told otherwise."""
    eos = _config(str(folder)).get("eos_token")
    return eos.get("content") if isinstance(eos, dict) else eos


def separator(data, folder: str | Path | None) -> tuple[str, int] | None:
    """(the token that ends each document, its id) for plain-text data; None for data=chat, without a
    tokenizer folder, or when the token is not in the tokenizer (`eos_problems` says why)."""
    if isinstance(data, (ChatData, PreferenceData)) or folder is None:
        return None
    vocab = _vocab(str(folder))
    token = data.eos
    if token is None:
        token = END_OF_TEXT if END_OF_TEXT in vocab else tokenizer_eos(folder)
    return (token, vocab[token]) if token in vocab else None


def eos_problems(data, folder: Path | None) -> list[Problem]:
    """data.eos is not a single token of the run's tokenizer (or, null, the tokenizer has neither
    `<|endoftext|>` nor an eos_token)."""
    if isinstance(data, (ChatData, PreferenceData)) or folder is None:
        return []
    try:
        if separator(data, folder) is not None:
            return []
        vocab = _vocab(str(folder))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return []  # unreadable tokenizer files: model_files reports them
    special = [t for t in vocab if t.startswith("<") and t.endswith(">")][:8]
    if data.eos is None:
        return [
            Problem(
                "data.eos",
                None,
                f"the tokenizer in {folder} has neither {END_OF_TEXT} nor an eos_token (tokenizer_config.json)",
                "a token of the tokenizer that ends each document",
                f"set data.eos to one of its tokens: {', '.join(special)}" if special else None,
            )
        ]
    return [
        Problem(
            "data.eos",
            data.eos,
            f"is not a single token of the run's tokenizer ({folder})",
            "a token of the tokenizer's vocabulary" + (f": {', '.join(special)}, ..." if special else ""),
            did_you_mean(data.eos, special) or "null: the model's end-of-text token",
        )
    ]


@dataclass(frozen=True)
class DataFigures:
    """What the plan shows of the data (plan.json's and summary.json's "data")."""

    source: str
    documents: int | None
    """Documents (conversations for data=chat) in the data; None: not known."""
    tokens: int | None
    """Tokens of the data (plain text: one separator per document included)."""
    tokens_from: str
    """How `tokens` was found: counted, or estimated from what."""
    epochs: float | None
    """Passes over the training documents that training.steps makes."""
    separator: str | None = None
    separator_id: int | None = None
    trained: int | None = None
    """data=chat: the tokens the loss trains (of the conversations checked)."""
    dropped: int | None = None
    truncated: int | None = None
    sequences: int | None = None
    """data=chat with data.pack: the sequences the training conversations pack into (`chat_packing`)."""
    fill: float | None = None
    """data=chat with data.pack: the share of those sequences' positions conversation tokens fill."""

    def as_json(self) -> dict:
        return asdict(self)


def _tokenizer(folder: str):
    from tokenizers import Tokenizer  # lazy: only where the plan counts tokens

    return Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))


def _texts(data, limit_docs: int, limit_bytes: int) -> list[str]:
    """The first documents of bundled/local data, as the loader cuts them."""
    path = CORPUS_DIR if data.source == "bundled" else Path(data.path)
    files, out, size = [Path(f) for f in data_files(path)], [], 0
    plain = all(f.suffix == ".txt" for f in files)
    for f in files:
        with open(f, encoding="utf-8") as fh:
            text = fh.read(limit_bytes - size)
        docs = (
            [p for p in text.split("\n\n") if p.strip()]
            if plain
            else _json_texts(text, getattr(data, "text_field", "text"))
        )
        for doc in docs:
            out.append(doc)
            size += len(doc.encode())
            if len(out) >= limit_docs or size >= limit_bytes:
                return out
    return out


def _json_texts(text: str, field: str) -> list[str]:
    if text.lstrip().startswith("["):
        return []
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and not text.endswith("\n"):
        lines = lines[:-1]  # cut by the byte limit
    return [json.loads(line)[field] for line in lines]


def _plain(data, folder: str) -> tuple[int | None, int | None, str]:
    """(documents, tokens, how the tokens were found) of bundled/local data."""
    texts = _texts(data, MAX_DOCS, SAMPLE_BYTES)
    path = CORPUS_DIR if data.source == "bundled" else Path(data.path)
    n = document_count(path)
    files = [Path(f) for f in data_files(path)]
    if not texts:
        return n, None, "not estimated (a JSON array)"
    sampled = sum(len(t.encode()) for t in texts)
    if n is None:  # large data: documents from the files' bytes
        n = round(len(texts) * sum(f.stat().st_size for f in files) / max(1, sampled))
        how = f"estimated from the first {len(texts):,} documents' tokens and the files' sizes"
    else:
        how = "counted" if len(texts) >= n else f"estimated from the first {len(texts):,} documents' tokens"
    return n, _scaled(folder, texts, n), how


def _scaled(folder: str, texts: list[str], n: int) -> int:
    """The tokens of n documents like `texts` (one separator each)."""
    try:
        counts = [len(e.ids) + 1 for e in _tokenizer(folder).encode_batch(texts, add_special_tokens=False)]
    except Exception:  # tokenizers' own errors; no tokenizer.json (vocab.json + merges.txt): bytes / 4
        counts = [len(t.encode()) // hf_data_files.BYTES_PER_TOKEN + 1 for t in texts]
    return round(sum(counts) * n / len(texts))


def _hf(data, folder: str) -> tuple[int | None, int | None, str]:
    src, _ = resolve(data)
    if src is None:
        return None, None, "not estimated"
    heads, _ = hf_data_files.read_heads(src, data.text_field)  # a problem: the data checks report it
    texts = [t for h in heads for t in h.texts if isinstance(t, str)]
    rows = sum(h.est_rows for h in heads) * len(src.files) / max(1, len(heads))
    n = round(rows)
    if not texts or not n:
        return n or None, None, "not estimated"
    exact = all(h.rows is not None and h.rows == len(h.texts) for h in heads) and len(heads) == len(src.files)
    how = "counted" if exact else f"estimated from the first {len(texts):,} rows' tokens"
    return n, _scaled(folder, texts, n), how


def _counts(key: str, folder: str, data) -> tuple[int | None, int | None, str]:
    """(documents, tokens, how) of plain-text data: counted once per data section and tokenizer in a
    process (a sweep's jobs share their data; the count tokenizes up to MAX_DOCS documents)."""
    if (key, folder) not in _COUNTED:
        try:
            _COUNTED[(key, folder)] = _hf(data, folder) if data.source == "hf" else _plain(data, folder)
        except (OSError, ValueError, KeyError, TypeError) as e:  # the data checks report what is wrong
            _COUNTED[(key, folder)] = (None, None, f"not estimated ({e})")
    return _COUNTED[(key, folder)]


_COUNTED: dict[tuple[str, str], tuple[int | None, int | None, str]] = {}


def figures(exp, folder: Path, batches) -> DataFigures:
    """The plan's figures of the data of `exp` (`folder`: the run's tokenizer; `batches`: the plan's)."""
    d, steps = exp.data, exp.training.steps
    share = 1 - (exp.validation.held_out or 0.0)
    if isinstance(d, ChatData):
        s = chat_files.stats(d, folder, exp.training.seq_len)
        how = "counted" if s.total == s.checked else f"of the first {s.checked:,} conversations"
        ep = chat_files.epochs(s, batches.global_batch_size * steps, exp.validation.held_out)
        figs = DataFigures("chat", s.total, s.tokens, how, ep, None, None, s.trained, s.dropped, s.truncated)
        return _packed(figs, exp, folder, batches) if d.pack else figs
    if isinstance(d, PreferenceData):
        return DataFigures("preference", *preference_files.figures(exp, folder, batches.global_batch_size))
    n, tokens, how = _counts(d.model_dump_json(), str(folder), d)
    ep = batches.tokens_per_step * steps / (tokens * share) if tokens else None
    sep = separator(d, folder)
    return DataFigures(d.source, n, tokens, how, ep, sep[0] if sep else None, sep[1] if sep else None)


def _packed(figs: DataFigures, exp, folder: Path, batches) -> DataFigures:
    """data.pack: the sequences the conversations pack into, and the epochs counted in sequences."""
    dp = batches.global_batch_size // (batches.local_batch_size * batches.grad_accum_steps)
    p = chat_packing.packing(exp.data, folder, exp.training.seq_len, dp, exp.validation.held_out)
    ep = batches.global_batch_size * exp.training.steps / p.sequences if p.sequences else None
    return replace(figs, epochs=ep, sequences=p.sequences, fill=p.fill)


def epochs_text(epochs: float | None) -> str:
    return "? epochs" if epochs is None else f"{epochs:.3g} epoch(s)"


def plan_lines(plan) -> list[str]:
    """The plan's lines about plain-text data, and data=chat's packing (`qwen3exp.plan.render`; the rest
    of data=chat: `chat_files.plan_lines`)."""
    f, d = plan.data, plan.exp.data
    if f and f.get("source") == "chat" and d.pack:
        return _pack_lines(plan)
    if not f or f.get("source") in ("chat", "preference", "mix"):  # mix: `mixture_lines`
        return []
    b, steps = plan.batches, plan.exp.training.steps
    n = f"{f['documents']:,}" if f["documents"] is not None else "?"
    tokens = f"{f['tokens']:,}" if f["tokens"] is not None else "?"
    held = " of the training documents" if plan.exp.validation.held_out else ""
    lines = (
        []
        if d.source == "hf"
        else [f"data:       {'bundled corpus ' + str(CORPUS_DIR) if d.source == 'bundled' else d.path}"]
    )
    return lines + [
        f"            {n} documents, {tokens} tokens ({f['tokens_from']}); {steps} steps x {b.tokens_per_step:,} "
        f"tokens = {epochs_text(f['epochs'])}{held}",
        f"            separator {f['separator']} (id {f['separator_id']}; data.eos"
        + (")" if d.eos is not None else ", null: the end-of-text token)"),
    ]


def _pack_lines(plan) -> list[str]:
    """data=chat with data.pack: the sequences, how full they are, and the epochs they make."""
    f, steps, gbs = plan.data, plan.exp.training.steps, plan.batches.global_batch_size
    seqs = f"{f['sequences']:,}" if f["sequences"] is not None else "?"
    fill = f"{f['fill']:.0%}" if f["fill"] is not None else "?"
    return [
        f"            packed (data.pack=true): the training conversations make {seqs} sequences of "
        f"{plan.exp.training.seq_len} tokens, {fill} conversation tokens (the rest padding); {steps} steps x "
        f"{gbs} sequences = {epochs_text(f['epochs'])}"
    ]

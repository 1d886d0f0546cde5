"""data=chat as the ranks deal it out: how many sequences the training conversations pack into
(data.pack=true), and whether every data-parallel rank gets conversations (`rank_problems`).

The ranks' packing is replayed on the conversations' lengths: the training side of the held-out
split, dealt out round-robin to the data-parallel ranks, each rank's conversations in file order
(the first epoch) fitted to training.seq_len (data.max_len_policy) and packed greedily
(`chat_render.packs`, the function the ranks' dataset packs with). A length is the tokens of the
conversation's chat-template rendering, the tokens `chat_render.render` trains on; only a
conversation that `truncate` cuts is rendered with its mask (a cut that keeps no trained token is
dropped, as the ranks drop it). Bounded as the other chat figures: the first
`chat_files.MAX_CHECKED` conversations; when the file holds more, the sequences are scaled to all
of them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from qwen3exp.config.sections.data import ChatData
from qwen3exp.data.chat import files as chat_files
from qwen3exp.data.chat.render import fit, load_tokenizer, messages_of, packs, records, render, template_text
from qwen3exp.data.files import held_out
from qwen3exp.errors import Problem


@dataclass(frozen=True)
class Packing:
    sequences: int | None
    """Sequences of training.seq_len the training conversations of all ranks pack into (one
    epoch); None when the conversations are not counted."""
    fill: float | None
    """The share of those sequences' positions that conversation tokens fill (the rest is padding)."""
    counted: bool
    """Every conversation was packed (else `sequences` is scaled from the first ones)."""


def _cache_key(data) -> tuple[tuple, tuple]:
    """What the cached figures depend on: the data keys, and each file's size and mtime."""
    files = chat_files.chat_files(data.location)
    stamp = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    return (data.location, data.messages_field, data.loss_on, data.max_len_policy), stamp


def packing(data, tokenizer_folder: str | Path, seq_len: int, dp: int, fraction: float | None) -> Packing:
    """data.pack's figures for `dp` data-parallel ranks and the held-out `fraction` (None: no split)."""
    return _packing(*_cache_key(data), str(tokenizer_folder), seq_len, dp, fraction)


@functools.lru_cache(maxsize=16)
def _packing(key: tuple, _stamp: tuple, folder: str, seq_len: int, dp: int, fraction: float | None) -> Packing:
    path, field, loss_on, policy = key
    tok = load_tokenizer(folder)
    lines = [line for _, _, line in records(path, chat_files.MAX_CHECKED)]
    total = chat_files.conversation_count(path)
    counted = total == len(lines)
    held = set(held_out(len(lines), fraction)) if counted and fraction is not None else set()
    train = [line for i, line in enumerate(lines) if i not in held]
    sizes = _sizes(tok, train, field, loss_on, policy, seq_len)
    sequences = filled = 0
    for rank in range(dp):
        for group in packs([n for n in sizes[rank::dp] if n is not None], int, seq_len):
            sequences += 1
            filled += sum(group)
    fill = filled / (sequences * seq_len) if sequences else None
    if counted or total is None:
        return Packing(sequences if counted else None, fill, counted)
    return Packing(round(sequences * total * (1 - (fraction or 0.0)) / len(lines)), fill, False)


def fitting_per_rank(data, tokenizer_folder: str | Path, seq_len: int, dp: int, fraction: float | None) -> list[int]:
    """How many training conversations each of the `dp` data-parallel ranks gets that fit
    training.seq_len (data.max_len_policy); [] when the conversations are not all counted."""
    return _fitting(*_cache_key(data), str(tokenizer_folder), seq_len, dp, fraction)


@functools.lru_cache(maxsize=16)
def _fitting(key: tuple, _stamp: tuple, folder: str, seq_len: int, dp: int, fraction: float | None) -> list[int]:
    path, field, loss_on, policy = key
    lines = [line for _, _, line in records(path, chat_files.MAX_CHECKED)]
    if chat_files.conversation_count(path) != len(lines):
        return []
    held = set(held_out(len(lines), fraction)) if fraction is not None else set()
    train = [line for i, line in enumerate(lines) if i not in held]
    sizes = _sizes(load_tokenizer(folder), train, field, loss_on, policy, seq_len)
    return [sum(n is not None for n in sizes[rank::dp]) for rank in range(dp)]


def _sizes(tok, lines: list[str], field: str, loss_on: str, policy: str, seq_len: int) -> list[int | None]:
    """The positions each conversation fills (its tokens less one), None for one the ranks drop."""
    conversations = [messages_of(line, field) for line in lines]
    texts = [template_text(tok, c) for c in conversations]
    lengths = [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]] if texts else []
    out: list[int | None] = []
    for m, n in zip(conversations, lengths, strict=True):
        if n <= seq_len + 1:
            out.append(n - 1)
        elif policy == "drop":
            out.append(None)
        else:  # truncate: cut to seq_len + 1 tokens, dropped when the cut trains nothing
            out.append(None if fit(render(tok, m, loss_on), seq_len, policy) is None else seq_len)
    return out


def rank_problems(exp, dp: int, tokenizer_folder: Path) -> list[Problem]:
    """data=chat: each of the `dp` data-parallel ranks reads every dp-th conversation of its side
    (training, held out), so a side with fewer conversations than ranks, or a rank none of whose
    training conversations fits training.seq_len, leaves a rank with nothing and it fails mid-run:
    refused here instead."""
    d = exp.data
    if not isinstance(d, ChatData) or (n := chat_files.conversation_count(d.location)) is None:
        return []
    fraction = exp.validation.held_out
    held = len(held_out(n, fraction)) if fraction is not None else 0
    out = []
    for side, count, key, fix in (
        ("training", n - held, "data.path", "more conversations, or fewer ranks"),
        ("held-out", held, "validation.fraction", "a larger validation.fraction, validation.path, or fewer ranks"),
    ):
        if (side == "training" or fraction is not None) and count < dp:
            value = d.path if key == "data.path" else fraction
            why = f"leaves {count} {side} conversation(s) for {dp} data-parallel ranks: a rank would read none"
            out.append(Problem(key, value, why, f"at least {dp} {side} conversations (one per rank)", fix))
    if out:
        return out
    fitting = fitting_per_rank(d, tokenizer_folder, exp.training.seq_len, dp, fraction)
    if fitting and min(fitting) == 0:
        rank = fitting.index(0)
        why = (
            f"leaves data-parallel rank {rank} of {dp} no training conversation that fits "
            f"(data.max_len_policy={d.max_len_policy}): it would fail at its first step"
        )
        fix = "a larger training.seq_len, data.max_len_policy=truncate, or fewer ranks"
        allowed = "a seq_len each rank's conversations fit"
        out.append(Problem("training.seq_len", exp.training.seq_len, why, allowed, fix))
    return out

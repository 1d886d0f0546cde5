"""Pre-launch checks of the data an objective trains on: data=chat's (`chat_files`), data=preference's
records, and whether the objective and the data kind agree (`qwen3exp.objectives.registry`).

data=preference: every record of the first `chat_files.MAX_CHECKED` is parsed
(`qwen3exp.data.preference.pairs`) and, with the run's tokenizer, both sides rendered; each bad one
is a problem naming the file, the line and the record's key (exit 2 before any worker)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from qwen3exp.config.sections.data import PreferenceData
from qwen3exp.data.chat import files as chat_files
from qwen3exp.data.chat.render import BadRecord, load_tokenizer, records
from qwen3exp.data.preference.pairs import fit_pair, pair_of, render_pair
from qwen3exp.errors import Problem
from qwen3exp.objectives import registry
from qwen3exp.plan import reference_model

_ALLOWED = (
    'JSON lines, each {"prompt": "..." or [messages], "chosen": "..." or [one assistant message], "rejected": '
    'likewise}, or {"chosen": [messages], "rejected": [messages]} sharing their prompt; chosen != rejected, '
    "neither empty"
)


def record_problems(
    data,
    validation,
    tokenizer_folder: Path | None,
    seq_len: int | None = None,
    objective=None,
    training=None,
    exp=None,
) -> list[Problem]:
    """Every problem of the data's records (chat or preference) and of the objective against the data."""
    problems = chat_files.chat_problems(data, validation, tokenizer_folder, seq_len)
    if objective is not None:
        problems += registry.problems(objective, data, training, exp)
    if not isinstance(data, PreferenceData):
        return problems
    own = validation is not None and validation.enable and validation.path is not None
    path = chat_files._path_problems("data.path", data.location)
    path += chat_files._path_problems("validation.path", validation.path) if own else []
    if path:
        return problems + path
    tok = None
    if tokenizer_folder is not None:
        try:
            tok = load_tokenizer(tokenizer_folder)
        except ValueError as e:
            return [*problems, Problem("data.source", "preference", str(e), "a tokenizer with a chat template")]
    problems += _pair_problems(data, tok)
    if own:
        problems += _pair_problems(data.model_copy(update={"path": validation.path}), tok, "validation.path")
    return problems  # the held-out split against the data-parallel ranks: `data_files.split_problems`


def _pair_problems(data: PreferenceData, tok, key: str = "data.path") -> list[Problem]:
    root, out, bad = Path(data.location), list[Problem](), 0
    for f, line_no, line in records(data.location, chat_files.MAX_CHECKED):
        try:
            pair = pair_of(line)
            if tok is not None:
                render_pair(tok, pair)
        except BadRecord as e:
            bad += 1
            if len(out) < chat_files.MAX_REPORTED:
                shown = str(f.relative_to(root)) if root.is_dir() else f.name
                out.append(Problem(key, data.location, f"{shown} line {line_no}: {e.key} {e.message}", _ALLOWED))
        except UnicodeDecodeError as e:
            return [Problem(key, data.location, f"{f.name} is not UTF-8 ({e.reason})", _ALLOWED)]
    if bad > len(out):
        last = out[-1]
        out[-1] = Problem(last.key, last.value, f"{last.message} (and {bad - len(out)} more bad record(s))", _ALLOWED)
    return out


@dataclass(frozen=True)
class PairStats:
    """The first `checked` pairs, rendered and fitted to training.seq_len."""

    checked: int
    total: int | None
    """Pairs in data.path (None: not counted, the files are too large)."""
    tokens: int
    """Tokens of both sides of the kept pairs."""
    chosen: int
    """Counted tokens (the final answer's content and end-of-turn token) of the kept pairs' chosen sides."""
    rejected: int
    dropped: int
    truncated: int


def stats(data: PreferenceData, tokenizer_folder: str | Path, seq_len: int) -> PairStats:
    """The plan's figures for data=preference (cached per data set as it is on disk)."""
    files = chat_files.chat_files(data.location)
    stamp = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    return _stats(data.location, data.max_len_policy, str(tokenizer_folder), seq_len, stamp)


@functools.lru_cache(maxsize=16)
def _stats(path: str, policy: str, tokenizer_folder: str, seq_len: int, _stamp: tuple) -> PairStats:
    tok = load_tokenizer(tokenizer_folder)
    checked = tokens = chosen = rejected = dropped = truncated = 0
    for _, _, line in records(path, chat_files.MAX_CHECKED):
        checked += 1
        sides = render_pair(tok, pair_of(line))
        fitted = fit_pair(sides, seq_len, policy)
        if fitted is None:
            dropped += 1
            continue
        truncated += any(len(f.ids) < len(s.ids) for f, s in zip(fitted, sides, strict=True))
        tokens += sum(len(f.ids) - 1 for f in fitted)
        chosen += sum(fitted[0].trained[1:])
        rejected += sum(fitted[1].trained[1:])
    return PairStats(checked, chat_files.conversation_count(path), tokens, chosen, rejected, dropped, truncated)


def figures(exp, folder: Path, global_batch_size: int) -> tuple:
    """(pairs, tokens, how, epochs, counted tokens, dropped, truncated) for the plan's DataFigures."""
    s = stats(exp.data, folder, exp.training.seq_len)
    how = "counted" if s.total == s.checked else f"of the first {s.checked:,} pairs"
    kept = None if s.total is None or not s.checked else s.total * (s.checked - s.dropped) / s.checked
    kept = kept * (1 - (exp.validation.held_out or 0.0)) if kept else None
    ep = global_batch_size // 2 * exp.training.steps / kept if kept else None
    return s.total, s.tokens, how, ep, s.chosen + s.rejected, s.dropped, s.truncated


def plan_lines(exp, tokenizer_folder: Path) -> list[str]:
    """The plan's lines about data=preference (none for other data)."""
    d = exp.data
    if not isinstance(d, PreferenceData):
        return []
    s = stats(d, tokenizer_folder, exp.training.seq_len)
    total = f"{s.total:,}" if s.total is not None else "?"
    of = f"the first {s.checked:,} of {total}" if s.total != s.checked else f"{s.checked:,}"
    ref = "no reference" if not registry.of(exp.objective).REFERENCE else reference_model.mode(exp)
    kept = max(1, s.checked - s.dropped)
    return [
        f"pairs:      {of} pairs: {s.tokens:,} tokens; counted (final answer + end of turn): chosen "
        f"{s.chosen / kept:.1f}, rejected {s.rejected / kept:.1f} tokens per pair",
        f"            at seq_len {exp.training.seq_len}: {s.dropped} dropped, {s.truncated} truncated "
        f"(data.max_len_policy={d.max_len_policy}); objective={exp.objective.kind}, {ref}",
    ]

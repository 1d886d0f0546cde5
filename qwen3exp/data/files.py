"""Pre-launch checks of the data an experiment reads (the model's files: `qwen3exp.plan.model_files`).

The path exists and holds data files the loader (`qwen3exp.titan.dataset`, which hands the files
`data_files` lists to `datasets`' "text" or "json" builder) reads, and the first records of each
file are what that loader accepts, so an empty, binary or malformed file is refused before any
worker starts, with the file and the line:
- every file: not empty, UTF-8;
- .txt (all files .txt: the "text" builder, one document per blank-line separated paragraph): some
  text that is not whitespace, no NUL bytes (a binary file);
- .jsonl / .json (the "json" builder, which reads every file of the folder as JSON, .txt included):
  one JSON object per line holding `data.text_field` as a non-empty string, or a file that starts
  with `[` (a JSON array of such objects, or of strings when the field is "text"). Like `datasets`
  4.7, blank lines and a byte-order mark are refused in the first file (its first block is parsed
  line by line), and accepted in the others (pyarrow skips them).

Bounded: the first `MAX_LINES` lines or `READ_BYTES` of each file (a first line longer than that is
read up to `MAX_LINE_BYTES`), of the first `MAX_FILES` files in the loader's order. Cheap: no
`datasets` import. One file's records are checked by `qwen3exp.data.records`; this module lists
the files, checks them together and checks the held-out split.
"""

from __future__ import annotations

import functools
import hashlib
import math
from pathlib import Path

from qwen3exp.assets import CORPUS_DIR
from qwen3exp.data.preference import source as pair_source
from qwen3exp.data.records import check_json, check_text
from qwen3exp.errors import Problem, nearby_path
from qwen3exp.units import MIB

MAX_FILES = 32
"""Files checked (in the loader's order); the rest are only listed by the loader."""
MAX_REPORTED = 5
"""Files with a problem reported one by one before the rest are counted."""
SUFFIXES = (".jsonl", ".json", ".txt")
"""The file types the loader reads (a folder's other files are ignored)."""
SCAN_BYTES = 8 * MIB
"""Bytes of JSON lines checked record by record beyond the files' heads (`data_records.check_rest`;
shared by the files checked): a broken record there would stop every rank mid-training. Larger data
is checked this far (about a second)."""


def data_files(path: str | Path) -> list[str]:
    """The files the loader reads for data.path, in its order: the file itself, or a folder's files
    with one of `SUFFIXES`, recursively, sorted. Plain Python: `qwen3exp.titan.dataset` hands this
    list to `datasets`, and the checks here read the same list."""
    p = Path(path)
    if p.is_file():
        return [str(p)]
    return sorted(str(f) for f in p.rglob("*") if f.suffix in SUFFIXES and f.is_file())


def held_out(n: int, fraction: float) -> list[int]:
    """The positions (sorted) of the documents held out for validation: round(n x fraction) of them,
    at least 1, chosen by a fixed hash of the position (spread over the whole corpus, not its tail).
    Raises ValueError when n is too small to keep documents on both sides."""
    k = max(1, round(n * fraction))
    if n < 2 or k >= n:
        raise ValueError(
            f"validation.fraction={fraction} of {n} document(s) leaves nothing to "
            f"{'train on' if n >= 1 else 'validate on'}: give validation.path, or more documents"
        )
    rank = sorted(range(n), key=lambda i: hashlib.sha256(f"qwen3exp-validation:{i}".encode()).digest())
    return sorted(rank[:k])


COUNT_BYTES = 16 * MIB
"""Data up to this size has its documents counted before launch (for the held-out split)."""


def document_count(path: str | Path) -> int | None:
    """The documents the loader reads from `path` (JSON lines: non-blank lines; .txt: blank-line
    separated paragraphs), or None when that is not counted (more than `COUNT_BYTES`, a JSON array)."""
    files = [Path(f) for f in data_files(path)]
    try:
        if sum(f.stat().st_size for f in files) > COUNT_BYTES:
            return None
        texts = [f.read_bytes() for f in files]
    except OSError:
        return None
    if all(f.suffix == ".txt" for f in files):
        return sum(len([p for p in t.split(b"\n\n") if p.strip()]) for t in texts)  # as `datasets` cuts them
    if any(t.lstrip().startswith(b"[") for t in texts):
        return None
    return sum(len([line for line in t.splitlines() if line.strip()]) for t in texts)


def split_problems(data, validation, ranks: int = 1) -> list[Problem]:
    """A held-out split (validation.fraction of data.path, or of the bundled corpus) that leaves a
    side fewer documents than the `ranks` data-parallel ranks (before the mesh is known: 1, a side
    empty), or data.path fewer documents than ranks: a rank would read none and fail mid-run."""
    if data.source == "preference":  # pairs, dealt out to the ranks as data=chat's conversations
        path, of, unit, n = data.location, "data.path" if data.path else "the bundled pairs", "pair", _pairs(data)
    elif data.source in ("local", "bundled"):
        path, of = (data.path, "data.path") if data.source == "local" else (CORPUS_DIR, "the bundled corpus")
        unit, n = "document", document_count(path)
    else:
        return []
    if not n:  # unreadable or empty: data_problems (pairs: preference_files) names it
        return []
    if validation is not None and validation.held_out is not None:
        return fraction_problems(n, validation.fraction, unit, of, ranks)
    if n >= ranks:
        return []
    why = f"holds {n} {unit}(s) for {ranks} data-parallel ranks: a rank would read none"
    return [Problem("data.path", str(path), why, f"at least {ranks} {unit}s (one per rank)", "fewer ranks")]


def _pairs(data) -> int | None:
    """The records of data=preference's files (None: none there, or more than COUNT_BYTES)."""
    src, _ = pair_source.resolve(data)
    return None if src is None else pair_source.count(src, COUNT_BYTES)


def fraction_problems(n: int, fraction: float, unit: str, of: str, ranks: int = 1) -> list[Problem]:
    """validation.fraction of `n` records (`unit`s of `of`) as a problem when it leaves a side fewer
    records than `ranks` (each data-parallel rank reads its own), naming what is left and the
    fractions that work (`held_out`: round(n x fraction) held out, at least one)."""
    if n <= 0:  # no records at all: the data's own check names that
        return []
    k = max(1, round(n * fraction))
    if n >= 2 and min(k, n - k) >= ranks:
        return []
    lo, hi = math.ceil(ranks / n * 10_000) / 10_000, math.floor((n - ranks) / n * 10_000) / 10_000
    per = f" for {ranks} data-parallel ranks (each reads its own)" if ranks > 1 else ""
    if n - k < ranks:
        why = f"holds out {k} of the {n} {unit}(s) of {of}, which leaves {max(0, n - k)} to train on{per}"
    else:
        why = f"holds out {k} of the {n} {unit}(s) of {of}{per}: a rank would validate on none"
    both = f"at least {ranks} {unit}s on each side" if ranks > 1 else "one held out at the least, one left to train on"
    if n < 2 * ranks or lo > hi:
        allowed = f"none for {n} {unit}(s): {both} needs {2 * ranks}"
    elif ranks == 1:
        allowed = f"at most {hi} for {n} {unit}s ({both})"
    else:
        allowed = f"{lo} to {hi} for {n} {unit}s and {ranks} ranks ({both})"
    fix = f"give validation.path (a data set of its own), use more {unit}s, or validation.enable=false"
    return [Problem("validation.fraction", fraction, why, allowed, fix)]


def data_problems(data, validation=None, ranks: int | None = 1) -> list[Problem]:
    """data.path (and validation.path, when given) exists and holds data files whose first records
    the loader accepts; a held-out split keeps `ranks` documents on each side (None: not checked
    here, the plan checks it once the data-parallel ranks are known)."""
    problems = []
    if data.source == "local":
        problems += path_problems("data.path", data.path, data.text_field)
    if not problems and ranks is not None:
        problems += split_problems(data, validation, ranks)
    if validation is not None and validation.enable and validation.path is not None:
        field = data.text_field if data.source == "local" else "text"
        problems += path_problems("validation.path", validation.path, field)
    return problems


def path_problems(key: str, value: str, text_field: str) -> list[Problem]:
    path = Path(value)
    allowed = f"an existing {' / '.join(SUFFIXES)} file or a folder holding such files"
    if not path.exists():
        return [Problem(key, value, "does not exist", allowed, nearby_path(path))]
    if path.is_file() and path.suffix not in SUFFIXES:
        return [Problem(key, value, f"unsupported file type {path.suffix or '(none)'}", allowed)]
    files = [Path(f) for f in data_files(path)]
    if not files:
        return [Problem(key, value, "the folder holds no data file", allowed)]
    try:
        stamp = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files[:MAX_FILES])
    except OSError:
        return content_problems(value, files, text_field, key=key)
    return list(_content_problems_of(value, tuple(files), text_field, key, stamp))


@functools.lru_cache(maxsize=64)
def _content_problems_of(
    value: str, files: tuple[Path, ...], text_field: str, key: str, _stamp: tuple
) -> tuple[Problem, ...]:
    """`content_problems`, once per data set as it is on disk (`_stamp`: each file's size and
    modification time): the points of a sweep share their data, and the scan of the records beyond
    the heads costs up to a second."""
    return tuple(content_problems(value, list(files), text_field, key=key))


def content_problems(value: str, files: list[Path], text_field: str, *, key: str = "data.path") -> list[Problem]:
    """The first records of `files` (the loader's list, in its order); `value` is data.path as given.
    Messages name a file by its path inside data.path (its name when data.path is the file)."""
    root = Path(value)

    def shown(f: Path) -> str:
        return str(f.relative_to(root)) if root.is_dir() and f.is_relative_to(root) else f.name

    text_only = all(f.suffix == ".txt" for f in files)
    problems: list[Problem] = []
    if not text_only and any(f.suffix == ".txt" for f in files):
        txt = [f for f in files if f.suffix == ".txt"]
        problems.append(
            Problem(
                key,
                value,
                f"mixes .txt files ({', '.join(map(shown, txt[:3]))}"
                f"{f' and {len(txt) - 3} more' if len(txt) > 3 else ''}) with .jsonl/.json files: the "
                "loader then reads every file as JSON lines, and a .txt file is not",
                "a folder of .txt files only, or of .jsonl / .json files only",
                "move the .txt files to a folder of their own",
            )
        )
        files = [f for f in files if f.suffix != ".txt"]
    field_problem: Problem | None = None
    bad_files: list[Problem] = []
    for i, f in enumerate(files[:MAX_FILES]):
        try:
            found = (
                check_text(f)
                if text_only
                else check_json(f, text_field, first=(i == 0), budget=SCAN_BYTES // min(len(files), MAX_FILES))
            )
        except OSError as e:
            found = f"cannot be read ({e.strerror or e})"
        if found is None:
            continue
        if isinstance(found, Problem):  # the text field itself is wrong, not the file
            field_problem = field_problem or found
            continue
        bad_files.append(
            Problem(key, value, f"{shown(f)}: {found}", _ALLOWED_TXT if text_only else _allowed_json(text_field))
        )
    if len(bad_files) > MAX_REPORTED:
        rest = len(bad_files) - MAX_REPORTED
        bad_files = bad_files[:MAX_REPORTED]
        last = bad_files[-1]
        bad_files[-1] = Problem(
            last.key, last.value, f"{last.message} (and {rest} more file(s) with problems)", last.allowed, last.hint
        )
    return problems + ([field_problem] if field_problem else []) + bad_files


_ALLOWED_TXT = "UTF-8 text files that hold some text (one document per blank-line separated paragraph)"


def _allowed_json(field: str) -> str:
    return f'UTF-8 JSON lines, one object per line with "{field}" a non-empty string'

"""Where data=preference's records come from, read one by one: the same records for the pre-launch
checks, the plan, `qwen3exp data show` and the ranks' loader.

- JSON lines: data.path (a .jsonl file or a folder of them), or the bundled pairs; each line is a
  record, every field of it checked (`qwen3exp.data.preference.pairs`).
- A dataset's files: data.name (the local Hugging Face cache) or data.files, resolved as data=hf
  resolves them (`qwen3exp.data.text.hf_source`: split, subset, the most common format); each row a
  record of its columns prompt (optional), chosen and rejected. Like data=hf, which reads its
  text_field column, the other columns are not read: the plan names them (`other_columns`). A
  columnar file gives every message of a column every field of the column's struct type, null where
  the message has none: those nulls are dropped, so a message is the fields it was written with.
Rows are read with pyarrow (parquet, arrow: what `datasets` depends on) and the standard library
(json, csv), in file order; no `datasets` import.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwen3exp.data.chat.render import chat_files, records
from qwen3exp.data.text import hf_source
from qwen3exp.errors import Problem

COLUMNS = ("prompt", "chosen", "rejected")
"""The columns of a dataset that hold a pair."""
JSONL = "jsonl"
"""The builder of data.path's JSON lines (a record per line, every field checked)."""


@dataclass(frozen=True)
class PairFiles:
    """The files data=preference reads, resolved."""

    key: str
    """data.path, data.name or data.files (validation.path for a separate validation set)."""
    value: str
    builder: str
    """jsonl (data.path), or a dataset file format: parquet, json, arrow, csv."""
    files: tuple[str, ...]
    root: str
    """Where the files' names are shown from (a folder), or the file itself."""

    def place(self, file: Path, number: int) -> str:
        """`train.jsonl line 3`, `data/train-0.parquet row 3`."""
        root = Path(self.root)
        shown = str(file.relative_to(root)) if root.is_dir() and file.is_relative_to(root) else file.name
        return f"{shown} {'line' if self.builder in (JSONL, 'json') else 'row'} {number}"


def resolve(data, key: str = "data.path") -> tuple[PairFiles | None, list[Problem]]:
    """The files of a PreferenceData section (`key`: the key that names data.path's JSON lines), or
    the problems naming the key to fix. Unreadable JSON-lines paths: `chat_files._path_problems`."""
    if data.name is None and data.files is None:
        location = data.location
        files = tuple(str(f) for f in chat_files(location)) if Path(location).exists() else ()
        return PairFiles(key, location, JSONL, files, location), []
    src, problems = hf_source.resolve(data)
    if src is None:
        return None, problems
    if src.repo_id is not None:  # names shown from the snapshot folder
        root = str(hf_source.cached_snapshot(src.repo_id, src.revision))
    else:
        root = src.value if Path(src.value).is_dir() else str(Path(src.files[0]).parent)
    return PairFiles(src.key, src.value, src.builder, src.files, root), []


def describe(data) -> str:
    """The data in words: data.path, or data=hf's description of a dataset's files."""
    if data.name is None and data.files is None:
        return data.location
    src, _ = hf_source.resolve(data)
    return src.describe() if src is not None else data.location


def rows(src: PairFiles, limit: int | None = None) -> Iterator[tuple[Path, int, str | dict[str, Any]]]:
    """(file, line or row number from 1, record) in file order, at most `limit`: a JSON line (str)
    for data.path, a dict of the pair columns for a dataset's files."""
    n = 0
    for name in src.files:
        for number, record in _file_rows(Path(name), src.builder):
            if limit is not None and n >= limit:
                return
            n += 1
            yield Path(name), number, record


def _file_rows(path: Path, builder: str) -> Iterator[tuple[int, str | dict[str, Any]]]:
    if builder == JSONL:
        for _, number, line in records(path):
            yield number, line
    elif builder in ("parquet", "arrow"):
        for i, row in enumerate(_arrow_rows(path, builder == "parquet"), 1):
            yield i, _pair_of_row(row)
    elif builder == "csv":
        with path.open(encoding="utf-8", newline="") as f:
            for i, row in enumerate(csv.DictReader(f), 1):
                yield i, _pair_of_row(row)
    elif path.read_text(encoding="utf-8").lstrip().startswith("["):  # json: one array of records
        for i, row in enumerate(json.loads(path.read_text(encoding="utf-8")), 1):
            yield i, _pair_of_row(row) if isinstance(row, dict) else json.dumps(row)
    else:  # json: JSON lines
        for _, number, line in records(path):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None  # pair_of names the line
            yield number, _pair_of_row(record) if isinstance(record, dict) else line


def _arrow_rows(path: Path, parquet: bool) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # lazy: from datasets; parquet files only

    if parquet:
        pf = pq.ParquetFile(path)
        wanted = [c for c in COLUMNS if c in pf.schema_arrow.names]
        for batch in pf.iter_batches(batch_size=256, columns=wanted):
            yield from batch.to_pylist()
        return
    for batch in hf_source.arrow_batches(path):
        yield from batch.to_pylist()


def _pair_of_row(row: dict[str, Any]) -> dict[str, Any]:
    """The pair columns of a row, the nulls of a columnar struct dropped (see the module's docstring)."""
    return {k: _no_nulls(row[k]) for k in COLUMNS if k in row and row[k] is not None}


def _no_nulls(value: Any) -> Any:
    if isinstance(value, list):
        return [_no_nulls(v) for v in value]
    if isinstance(value, dict):
        return {k: _no_nulls(v) for k, v in value.items() if v is not None}
    return value


def other_columns(src: PairFiles) -> list[str]:
    """The columns of a dataset's first file that hold no part of a pair (not read); [] for JSON lines."""
    if src.builder == JSONL or not src.files:
        return []
    return [c for c in _columns(Path(src.files[0]), src.builder) if c not in COLUMNS]


def _columns(path: Path, builder: str) -> list[str]:
    import pyarrow as pa  # lazy: from datasets; a dataset's files only
    import pyarrow.parquet as pq  # lazy: the same

    if builder == "parquet":
        return list(pq.ParquetFile(path).schema_arrow.names)
    if builder == "arrow":
        with pa.memory_map(str(path)) as source:
            try:
                return list(pa.ipc.open_stream(source).schema.names)
            except pa.ArrowInvalid:
                return list(pa.ipc.open_file(source).schema.names)
    if builder == "csv":
        with path.open(encoding="utf-8", newline="") as f:
            return next(csv.reader(f), [])
    text = path.read_text(encoding="utf-8").lstrip()
    if not text:
        return []
    record = json.loads(text)[0] if text.startswith("[") else json.loads(text.splitlines()[0])
    return list(record) if isinstance(record, dict) else []


def count(src: PairFiles, max_bytes: int) -> int | None:
    """The records of the files (None: none there, or more than `max_bytes` of them: not counted)."""
    if not src.files:
        return None
    try:
        if sum(Path(f).stat().st_size for f in src.files) > max_bytes:
            return None
    except OSError:
        return None
    return sum(1 for _ in rows(src))


def stamp(src: PairFiles) -> tuple:
    """The files as they are on disk (a cache key)."""
    return tuple((f, Path(f).stat().st_size, Path(f).stat().st_mtime_ns) for f in src.files)

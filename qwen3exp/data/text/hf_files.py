"""Pre-launch checks of `data=hf` (the files: `qwen3exp.data.text.hf_source`).

The dataset resolves (by name in the local Hugging Face cache, or by files), the split and the
subset exist, and the first records of the first `MAX_FILES` files hold `data.text_field` as text:
- parquet: the schema and the first rows of the column (pyarrow, which `datasets` depends on);
- arrow: the same, through pyarrow's IPC reader (stream or file format);
- .jsonl / .json: the checks of `data=local` (`qwen3exp.data.records.check_json`);
- csv: the header and the first rows.
Then there are enough tokens for one batch (local_batch_size x seq_len), estimated as text bytes / 4
(the text of the first rows, extrapolated to the file's rows), and a held-out split keeps documents
on both sides (row counts: parquet and arrow metadata, counted lines of small json/csv files).
Bounded: `MAX_ROWS` rows or `data_records.READ_BYTES` per file; no `datasets` import.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

from qwen3exp.data.files import COUNT_BYTES, fraction_problems
from qwen3exp.data.records import READ_BYTES, check_json
from qwen3exp.data.text import hf_source
from qwen3exp.data.text.hf_source import HFSource, resolve
from qwen3exp.errors import Problem, did_you_mean

MAX_FILES = 8
"""Files whose first rows are read; a dataset with more files is assumed to hold one batch."""
MAX_ROWS = 100
"""Rows read per file."""
BYTES_PER_TOKEN = 4
"""The estimate of text bytes per token (a lower bound on tokens for most text and tokenizers)."""


@dataclass
class Head:
    """The first rows of one file."""

    columns: list[str]
    texts: list
    """The first values of the text field ([] when the field is missing)."""
    rows: int | None
    """The file's rows (None: not counted)."""
    est_rows: float
    """The rows, estimated when not counted."""


def hf_problems(data, training=None, validation=None) -> list[Problem]:
    """What is wrong with a data=hf section (nothing for another data source)."""
    if getattr(data, "source", None) != "hf":
        return []
    src, problems = resolve(data)
    if src is None:
        return problems
    heads, problem = read_heads(src, data.text_field)
    if problem is not None:
        return [problem]
    problems += _token_problems(src, heads, training)
    problems += _split_problems(src, data, heads, validation)
    return problems


def read_heads(src, field: str) -> tuple[list[Head], Problem | None]:
    """The first rows of the dataset's first MAX_FILES files, or the first file's problem."""
    heads: list[Head] = []
    for i, f in enumerate(src.files[:MAX_FILES]):
        try:
            head, problem = _read(Path(f), src.builder, field, first=i == 0)
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
            head, problem = None, f"cannot be read ({e})"
        if isinstance(problem, Problem):
            return heads, problem
        if problem is not None:
            return heads, Problem(
                src.key, src.value, f"{Path(f).name}: {problem}", f"{src.builder} files of text records"
            )
        if head is not None:
            heads.append(head)
    return heads, None


def _read(path: Path, builder: str, field: str, *, first: bool) -> tuple[Head | None, str | Problem | None]:
    match builder:
        case "parquet" | "arrow":
            head = _arrow_head(path, field, parquet=builder == "parquet")
        case "csv":
            head = _csv_head(path, field)
        case _:
            found = check_json(path, field, first=first, budget=0)
            return (_json_head(path, field) if found is None else None), found
    if field not in head.columns:
        if first:
            return None, Problem(
                "data.text_field",
                field,
                f"the first file ({path.name}) has no column {field!r} (its columns: {', '.join(head.columns)})",
                "a column of every record that holds its text",
                did_you_mean(field, head.columns),
            )
        return None, f"has no column {field!r} (its columns: {', '.join(head.columns)})"
    for n, value in enumerate(head.texts, 1):
        if not isinstance(value, str):
            what = "null" if value is None else type(value).__name__
            if n == 1 and first:
                return None, Problem(
                    "data.text_field", field, f"row 1 of {path.name} holds {what}, not text", "a text column"
                )
            return None, f"row {n}: {field!r} is {what}, not text"
    return head, None


def _arrow_head(path: Path, field: str, *, parquet: bool) -> Head:
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # lazy: from datasets; data=hf parquet only

    if parquet:
        pf = pq.ParquetFile(path)
        columns, rows = pf.schema_arrow.names, pf.metadata.num_rows
        texts = []
        if field in columns and rows:
            texts = next(pf.iter_batches(batch_size=MAX_ROWS, columns=[field])).column(0).to_pylist()
        return Head(columns, texts, rows, rows)
    batches = hf_source.arrow_batches(path)
    columns = batches[0].schema.names if batches else []
    rows = sum(b.num_rows for b in batches)
    texts = batches[0].column(field).to_pylist()[:MAX_ROWS] if batches and field in columns else []
    return Head(columns, texts, rows, rows)


def _prefix(path: Path) -> tuple[str, int, bool]:
    """(the file's first whole lines, their bytes, whether that is the whole file)."""
    with open(path, "rb") as f:
        data = f.read(READ_BYTES)
        complete = f.read(1) == b""
    if not complete and b"\n" in data:
        data = data[: data.rindex(b"\n") + 1]
    return data.decode("utf-8", errors="replace"), len(data), complete


def _estimate(path: Path, rows_read: int, bytes_read: int, complete: bool) -> tuple[int | None, float]:
    if complete:
        return rows_read, rows_read
    size = path.stat().st_size
    if size <= COUNT_BYTES and path.suffix != ".csv":  # csv fields may span lines: estimated only
        with open(path, "rb") as f:
            n = sum(1 for line in f if line.strip())
        return n, n
    return None, rows_read * size / max(1, bytes_read)


def _csv_head(path: Path, field: str) -> Head:
    text, nbytes, complete = _prefix(path)
    reader = csv.DictReader(io.StringIO(text))
    columns = list(reader.fieldnames or [])
    records = list(reader)
    rows, est = _estimate(path, len(records), nbytes, complete)
    return Head(columns, [r.get(field) for r in records[:MAX_ROWS]] if field in columns else [], rows, est)


def _json_head(path: Path, field: str) -> Head:
    text, nbytes, complete = _prefix(path)
    if text.lstrip().startswith("["):  # a JSON array: its text estimated from the file's bytes
        return Head([field], [], None, path.stat().st_size / max(1, BYTES_PER_TOKEN))
    lines = [line for line in text.splitlines() if line.strip()]
    texts = [json.loads(line)[field] for line in lines[:MAX_ROWS]]
    rows, est = _estimate(path, len(lines), nbytes, complete)
    return Head([field], texts, rows, est)


def estimated_tokens(heads: list[Head]) -> int:
    """Text bytes / BYTES_PER_TOKEN of every row (the first rows' mean bytes x the rows), plus one
    separator per row."""
    total = 0.0
    for h in heads:
        mean = sum(len(t.encode()) for t in h.texts) / len(h.texts) if h.texts else BYTES_PER_TOKEN
        total += h.est_rows * (mean / BYTES_PER_TOKEN + 1)
    return int(total)


def _token_problems(src: HFSource, heads: list[Head], training) -> list[Problem]:
    if training is None or len(src.files) > MAX_FILES:
        return []
    need = training.local_batch_size * training.seq_len
    have = estimated_tokens(heads)
    if have >= need:
        return []
    return [
        Problem(
            src.key,
            src.value,
            f"holds about {have:,} tokens (text bytes / {BYTES_PER_TOKEN}), fewer than one batch "
            f"(training.local_batch_size x training.seq_len = {need:,})",
            "a dataset of at least one batch",
            "check data.split and data.subset, or lower training.seq_len / training.local_batch_size",
        )
    ]


def is_held_out(i: int, fraction: float) -> bool:
    """A streamed dataset's held-out rule (its length is unknown): the row at position i is held out
    when the fixed hash of `data_files.held_out`, as a fraction of its range, is below `fraction`."""
    digest = hashlib.sha256(f"qwen3exp-validation:{i}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


def _split_problems(src: HFSource, data, heads: list[Head], validation) -> list[Problem]:
    fraction = validation.held_out if validation is not None else None
    if fraction is None or len(src.files) > MAX_FILES or any(h.rows is None for h in heads):
        return []
    n = sum(h.rows or 0 for h in heads)
    if not data.streaming:
        return fraction_problems(n, fraction, "row", src.value)
    k = sum(is_held_out(i, fraction) for i in range(n))
    if 0 < k < n:
        return []
    return [
        Problem(
            "validation.fraction",
            fraction,
            f"holds out {k} of the {n} row(s) of {src.value} (streamed: each row by its hash), which leaves "
            f"{n - k} to train on"
            if k
            else f"holds out none of the {n} row(s) of {src.value} (streamed: each row by its hash)",
            f"a fraction that keeps at least one row on each side of {n}",
            "give validation.path, use more rows, or validation.enable=false",
        )
    ]


def plan_lines(exp) -> list[str]:
    """The plan's line for data=hf (`qwen3exp.plan.render`): the dataset, its snapshot and its files."""
    if getattr(exp.data, "source", None) != "hf":
        return []
    src, _ = resolve(exp.data)
    if src is None:
        return []
    how = "streamed" if exp.data.streaming else "loaded"
    return [f"data:       {src.describe()}; split {exp.data.split}, field {exp.data.text_field!r}, {how}"]

"""metrics.jsonl, read back: its training and validation rows, the lines that are no metrics row,
and cutting it (and samples.jsonl) at the step a resumed run starts from (the run writes them:
`qwen3exp.titan.metrics`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qwen3exp.objectives.registry import METRICS
from qwen3exp.run import records, rundir

METRIC_NUMBERS = (
    "loss",
    "grad_norm",
    "tokens_per_second",
    "memory_gib",
    "mfu",
    "lr",
    "step_seconds",
    "val_loss",
    "val_perplexity",
    *METRICS,  # a preference objective's, and its validation's:
    "val_reward_accuracy",
)
"""The values of a metrics row (qwen3exp.titan.metrics): each a number or null."""
SOURCE_LOSS = "val_loss_"
"""A data mixture's validation row has `val_loss_<source>` for each source (a number or null)."""


def read_metrics(run_dir: Path) -> list[dict]:
    """The training rows of metrics.jsonl (one per logged step, with `loss`)."""
    return [r for r in metrics_rows(run_dir) if "loss" in r]


def read_validation(run_dir: Path) -> list[dict]:
    """The validation rows of metrics.jsonl (`step`, `val_loss`, `val_perplexity`)."""
    return [r for r in metrics_rows(run_dir) if "val_loss" in r]


def validation_extras(row: dict) -> dict[str, float]:
    """A validation row's numbers besides its loss and perplexity: a preference objective's
    `val_reward_accuracy`, a data mixture's `val_loss_<source>` of each source (null ones left out)."""
    keys = [k for k in row if k == "val_reward_accuracy" or k.startswith(SOURCE_LOSS)]
    return {k: row[k] for k in keys if row[k] is not None}


def metrics_rows(run_dir: Path) -> list[dict]:
    """Every row of metrics.jsonl, training and validation; a line that is no metrics row (a torn
    last line of a killed run, garbage) is left out, and so is a file that is not readable as data."""
    try:
        return scan_metrics(run_dir)[0]
    except records.Unreadable:
        return []


def scan_metrics(run_dir: Path) -> tuple[list[dict], list[str]]:
    """(the rows of metrics.jsonl, one `line N: why` for each line that is no metrics row); raises
    records.Unreadable when the file is no regular file or too large."""
    rows: list[dict] = []
    skipped: list[str] = []
    for number, row in records.json_lines(run_dir / rundir.METRICS):
        why = row.why if isinstance(row, records.Unreadable) else metrics_row_problem(row)
        if why is None:
            rows.append(row)
        else:
            skipped.append(f"line {number}: {why}")
    return rows, skipped


def metrics_row_problem(row: Any) -> str | None:
    """Why a parsed metrics.jsonl line is no metrics row (None: it is one)."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object"
    step = row.get("step")
    if type(step) is not int or not 0 <= step < 2**63:
        return f"step {step!r} is not a step number"
    for key in (*METRIC_NUMBERS, *(k for k in row if k.startswith(SOURCE_LOSS))):
        value = row.get(key)
        # bool is an int, and an int beyond 2**63 no float (the report formats and plots floats)
        if value is not None and type(value) is not float and not (type(value) is int and abs(value) < 2**63):
            return f"{key} {value!r} is not a number"
    return None


def truncate_metrics(run_dir: Path, last_step: int) -> None:
    """Keep the metrics rows up to `last_step` (a resumed run appends the later steps again)."""
    rows = [r for r in metrics_rows(run_dir) if r.get("step", 0) <= last_step]
    rundir.atomic_write_text(run_dir / rundir.METRICS, "".join(json.dumps(r) + "\n" for r in rows))


def truncate_samples(run_dir: Path, last_step: int | None) -> None:
    """samples.jsonl before any rank starts: a fresh run (`last_step` None) starts without one; a
    resumed run keeps the answers of the steps up to `last_step` (its validations after it run again)."""
    path = run_dir / rundir.SAMPLES
    if last_step is None or not path.is_file():
        path.unlink(missing_ok=True)
        return
    try:
        rows = [r for _, r in records.json_lines(path) if isinstance(r, dict)]
    except records.Unreadable:
        rows = []
    kept = [r for r in rows if type(r.get("step")) is int and r["step"] <= last_step]
    rundir.atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))

"""The report's table: one row per run, its varied keys, its lm-eval scores (`eval.<task>.<metric>`
columns, when runs recorded some), a data mixture's weight and val loss of each source
(`qwen3exp.analysis.mixture_columns`) and final metrics, ranked by the objective.

Rendered for a terminal (aligned, clipped, no raw escapes), as Markdown or as CSV
(`qwen3exp.analysis.report` prints it and writes the files).
"""

from __future__ import annotations

import csv
import io
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwen3exp.analysis import mixture_columns
from qwen3exp.analysis.cells import FORMATS, cell, esc
from qwen3exp.analysis.diff import show
from qwen3exp.analysis.runs import Run, compared, varied_keys
from qwen3exp.config.sections.sweep import EVAL_PREFIX
from qwen3exp.errors import printable
from qwen3exp.run import objective, rundir

METRIC_COLUMNS = (
    "status",
    "steps",
    "final loss",
    "val loss",
    "tokens/s",
    "plan mem GiB",
    "peak mem GiB",
    "mem ratio",
    "step ratio",
    "wall s",
)
"""The plan's per-rank memory estimate, the peak the ranks measured and their ratio sit side by side,
then measured / predicted step time: every run checks the estimates (`qwen3exp.run.scorecard`)."""
EARLIER_METRIC_COLUMNS = (
    ("status", "steps", "final loss", "val loss", "tokens/s", "peak mem GiB", "wall s"),
    ("status", "steps", "final loss", "val loss", "tokens/s", "plan mem GiB", "peak mem GiB", "mem ratio", "wall s"),
)
"""The columns of report.csv files earlier versions wrote: still recognised as report's own."""
SCORE_FORMATS = {"plan mem GiB": "{:.2f}", "mem ratio": "{:.2f}x", "step ratio": "{:.3g}x"}
"""The format of the score columns (`qwen3exp.analysis.cells.FORMATS` has the others)."""
NUMERIC = ("steps", *FORMATS, *SCORE_FORMATS)
"""The columns aligned to the right."""


@dataclass
class Table:
    header: list[str]
    rows: list[list[Any]]
    """Raw values (numbers, strings, None)."""
    runs: list[Run]
    varied: list[str]
    objective: tuple[str, str] | None = None
    """(metric, direction) the rows are ranked by (best first); None: in the given order."""

    @property
    def best(self) -> Run | None:
        """The best run by the objective (None: no run has a value)."""
        if self.objective is None or not self.runs or self.runs[0].objective_value is None:
            return None
        return self.runs[0]


def ranking(runs: list[Run]) -> tuple[str, str] | None:
    """The objective the runs share (they rank by it only when every run that recorded one recorded
    the same metric and direction)."""
    found = {r.objective for r in runs if r.objective is not None}
    return found.pop() if len(found) == 1 else None


def table(runs: list[Run], *, root: Path | None = None, status: dict[Path, str] | None = None) -> Table:
    """The report table; `status` replaces the recorded status of some runs (e.g. skipped). Ranked
    by the runs' objective, best first, runs without a value last (stable: ties keep their order)."""
    known = [r for r in runs if r.experiment or r.readable]  # an unreadable experiment varies nothing
    varied = varied_keys(known) if len(known) > 1 else []
    status = status or {}
    rank = ranking(runs) if len(runs) > 1 else None
    if rank is not None:
        key = objective.better(rank[1])
        runs = sorted(runs, key=lambda r: key(r.objective_value))
    rows = []
    scores = list(dict.fromkeys(k for r in runs for k in r.scores))
    mix_header, mix_rows = mixture_columns.columns(runs)  # data=mix: each source's weight and val loss
    for r, mixed in zip(runs, mix_rows, strict=True):
        flat = compared(r.experiment)
        rows.append(
            [
                _label(r.path, root),
                *(flat.get(k) for k in varied),
                *(r.scores.get(k) for k in scores),
                *mixed,
                status.get(r.path, r.status),
                r.steps,
                r.final_loss,
                r.val_loss,
                r.tokens_per_second,
                r.predicted_memory_gib,
                r.peak_memory_gib,
                r.memory_ratio,
                r.step_ratio,
                r.wall_seconds,
            ]
        )
    header = ["run", *varied, *(f"{EVAL_PREFIX}{k}" for k in scores), *mix_header, *METRIC_COLUMNS]
    return Table(header, rows, runs, varied, rank)


def best_line(t: Table) -> str | None:
    """`best: ... (val_loss 5.8123, minimized); rerun it: qwen3exp relaunch RUN` or None."""
    best = t.best
    if best is None or t.objective is None:
        return None
    flat = rundir.flatten(best.experiment)
    point = " ".join(f"{k}={show(flat.get(k))}" for k in t.varied) or str(best.path)
    metric, direction = t.objective
    return (
        f"best by {metric} ({direction}d): {point}  {metric} {best.objective_value:.6g}\n"
        f"  rerun it: qwen3exp relaunch {shlex.quote(str(best.path))}"
    )


def _label(path: Path, root: Path | None) -> str:
    if root is not None:
        try:
            rel = Path(path).resolve().relative_to(Path(root).resolve())
            if str(rel) != ".":
                return str(rel)
        except ValueError:
            pass
    return Path(path).name


def _cell(column: str, value: Any) -> str:
    if column in SCORE_FORMATS and isinstance(value, (int, float)) and not isinstance(value, bool):
        return SCORE_FORMATS[column].format(value)
    if column.startswith(EVAL_PREFIX) and isinstance(value, float):  # an lm-eval score (eval=lm_eval)
        return f"{value:.4g}"
    return mixture_columns.cell(column, value) or cell(column, value)


def _numeric(column: str) -> bool:
    return column in NUMERIC or column.startswith(EVAL_PREFIX) or mixture_columns.is_column(column)


def _cells(t: Table) -> list[list[str]]:
    return [[_cell(c, v) for c, v in zip(t.header, row, strict=True)] for row in t.rows]


def render_terminal(t: Table, *, max_rows: int | None = None, max_cell: int = 48) -> str:
    """An aligned table for one screen. When keys vary, they name the rows and the (long) run folder
    names give way to a row number (`#`); Markdown and CSV keep the folder names."""

    def clip(s: str) -> str:  # values come from recorded files: no raw terminal escapes
        s = printable(s, max_cell)
        return s if len(s) <= max_cell else s[: max_cell - 1] + "…"

    cells = [[clip(c) for c in row] for row in _cells(t)]
    header = [clip(h) for h in t.header]
    if t.varied:
        header[0] = "#"
        for i, row in enumerate(cells, 1):
            row[0] = str(i)
    more = 0
    if max_rows is not None and len(cells) > max_rows:
        more, cells = len(cells) - max_rows, cells[:max_rows]
    widths = [max(len(x) for x in col) for col in zip(header, *cells, strict=True)]
    numeric = {i for i, h in enumerate(t.header) if _numeric(h)} | ({0} if t.varied else set())

    def line(row):
        return "  ".join(
            c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()

    out = [line(header), line(["-" * w for w in widths]), *(line(r) for r in cells)]
    if more:
        out.append(f"... {more} more run(s): python -m qwen3exp.analysis.report <dir> --format markdown")
    return "\n".join(out)


def render_markdown(t: Table) -> str:
    numeric = {h for h in t.header if _numeric(h)}
    out = [
        "| " + " | ".join(esc(h) for h in t.header) + " |",
        "| " + " | ".join("---:" if h in numeric else "---" for h in t.header) + " |",
    ]
    out += ["| " + " | ".join(esc(c) for c in row) + " |" for row in _cells(t)]
    return "\n".join(out)


def render_csv(t: Table) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(t.header)
    for row in t.rows:
        w.writerow(["" if v is None else v for v in row])
    return buf.getvalue()

"""Two runs side by side (`report A B`): the resolved experiment keys that differ (`qwen3exp
diff`'s, presentation keys left out) and the final metrics with B - A and B / A (A: the first run,
B: the second)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qwen3exp.analysis import mixture_columns
from qwen3exp.analysis.cells import FORMATS, cell, esc
from qwen3exp.analysis.diff import show
from qwen3exp.analysis.runs import Run
from qwen3exp.run import rundir
from qwen3exp.run.identity import differences

COMPARED = (
    ("steps", "steps"),
    ("final loss", "final_loss"),
    ("val loss", "val_loss"),
    ("tokens/s", "tokens_per_second"),
    ("peak mem GiB", "peak_memory_gib"),
    ("wall s", "wall_seconds"),
)
"""(column, Run attribute) of the final metrics a comparison puts side by side."""


@dataclass
class Comparison:
    a: Run
    b: Run
    changes: list[tuple[str, Any, Any]]
    """(dotted key, value in A, value in B) of every experiment key that differs (`qwen3exp diff`'s)."""
    metrics: list[tuple[str, Any, Any]]
    """(column, A's value, B's value) for each of COMPARED."""


def compare(a: Run, b: Run) -> Comparison:
    """B against A: the resolved experiment keys that differ and the final metrics side by side (a
    data mixture's validation loss of each source after `val loss`)."""
    metrics = [(column, getattr(a, attr), getattr(b, attr)) for column, attr in COMPARED]
    at = [column for column, _ in COMPARED].index("val loss") + 1
    metrics[at:at] = mixture_columns.compared(a, b)
    return Comparison(
        a,
        b,
        differences(rundir.identity_view(a.experiment), rundir.identity_view(b.experiment)),
        metrics,
    )


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def delta(column: str, va: Any, vb: Any) -> str:
    """B - A, signed, in the column's format ("-" when either is missing)."""
    if not (_number(va) and _number(vb)):
        return "-"
    d = vb - va
    if column == "steps" and isinstance(d, int):
        return f"{d:+d}"
    form = mixture_columns.column_format(column) or FORMATS.get(column, "{:.6g}")
    return form.replace("{:", "{:+").format(d)


def ratio(va: Any, vb: Any) -> str:
    """B / A as `0.982x` ("-" when either is missing or A is 0)."""
    if not (_number(va) and _number(vb)) or va == 0:
        return "-"
    return f"{vb / va:.3f}x"


def _cell(column: str, value: Any) -> str:
    return mixture_columns.cell(column, value) or cell(column, value)


def metric_rows(c: Comparison) -> list[list[str]]:
    return [
        [column, _cell(column, va), _cell(column, vb), delta(column, va, vb), ratio(va, vb)]
        for column, va, vb in c.metrics
    ]


def render_comparison(c: Comparison) -> str:
    """The comparison block of the terminal report."""
    out = [f"B vs A:  A = {c.a.path}", f"         B = {c.b.path}"]
    if c.changes:
        width = max(len(k) for k, _, _ in c.changes)
        out.append("experiment keys that differ (A -> B):")
        out += [f"  {key:<{width}}  {show(va)} -> {show(vb)}" for key, va, vb in c.changes]
    else:
        out.append("identical resolved experiments")
    rows = [["", "A", "B", "B - A", "B / A"], *metric_rows(c)]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    out.append("final metrics:")
    for r in rows:
        out.append(
            "  "
            + "  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(r, widths, strict=True)))
        )
    return "\n".join(line.rstrip() for line in out)


def render_comparison_markdown(c: Comparison) -> str:
    """The comparison section of report.md (and of `--format markdown`)."""
    out = ["## B vs A", "", f"A: `{c.a.path}`, B: `{c.b.path}`", ""]
    if c.changes:
        out += ["| key | A | B |", "| --- | --- | --- |"]
        out += [f"| {esc(k)} | {esc(show(va))} | {esc(show(vb))} |" for k, va, vb in c.changes]
    else:
        out.append("Identical resolved experiments.")
    out += ["", "| metric | A | B | B - A | B / A |", "| --- | ---: | ---: | ---: | ---: |"]
    out += ["| " + " | ".join(esc(x) for x in row) + " |" for row in metric_rows(c)]
    return "\n".join(out)

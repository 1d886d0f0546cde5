"""How a report shows a value: a metric column in its format, any other value as `qwen3exp diff`
shows it, and a Markdown table cell escaped."""

from __future__ import annotations

from typing import Any

from qwen3exp.analysis.diff import show

FORMATS = {
    "final loss": "{:.4f}",
    "val loss": "{:.4f}",
    "tokens/s": "{:,.0f}",
    "peak mem GiB": "{:.2f}",
    "wall s": "{:.1f}",
}
"""The format of each metric column that holds a number."""


def cell(column: str, value: Any) -> str:
    """A table cell: `-` for no value."""
    if value is None:
        return "-"
    if column in FORMATS and isinstance(value, (int, float)):
        return FORMATS[column].format(value)
    if column in ("run", "status"):
        return str(value)
    return show(value)


def esc(s: str) -> str:
    """A Markdown table cell: `|` escaped."""
    return s.replace("|", "\\|")

"""The report's columns of a data mixture (data=mix): each source's weight next to its validation loss.

For every source any of the runs mixed (in the order they first appear), two columns side by side:
`weight <source>`, the source's share of the trained tokens as the run normalised it (its weight over
the sum of the weights: what a sweep over raw weights actually varied), and `val loss <source>`,
the run's last `val_loss_<source>` (`qwen3exp.titan.mixture_validator`). A run without the source
(or without a mixture) shows `-`; when no run mixed sources there are no such columns. `report A B`
compares the two runs' `val loss <source>` after their `val loss` (`compared`).
"""

from __future__ import annotations

from typing import Any

from qwen3exp.analysis.runs import Run
from qwen3exp.config.sections.mixture import Share
from qwen3exp.run.metrics_file import SOURCE_LOSS

WEIGHT, LOSS = "weight ", "val loss "
"""The columns' prefixes (each followed by the source's name)."""
FORMATS = {WEIGHT: "{:.3f}", LOSS: "{:.4f}"}
_DEFAULT_WEIGHT = Share.model_fields["weight"].default


def column_format(column: str) -> str | None:
    """The format of a mixture column (None: not one)."""
    return next((f for p, f in FORMATS.items() if column.startswith(p)), None)


def is_column(column: str) -> bool:
    return column.startswith(tuple(FORMATS))


def cell(column: str, value: Any) -> str | None:
    """The cell of a mixture column holding a number (None: not such a cell)."""
    form = column_format(column)
    if form is None or not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    return form.format(value)


def _sources(experiment: dict) -> dict[str, Any]:
    data = experiment.get("data")
    if not isinstance(data, dict) or data.get("source") != "mix" or not isinstance(data.get("sources"), dict):
        return {}
    return data["sources"]


def weights(experiment: dict) -> dict[str, float]:
    """Each source's normalised weight in a recorded experiment ({}: no mixture)."""
    raw: dict[str, float] = {}
    for name, src in _sources(experiment).items():
        w = src.get("weight", _DEFAULT_WEIGHT) if isinstance(src, dict) else None
        if isinstance(w, (int, float)) and not isinstance(w, bool):
            raw[str(name)] = float(w)
    total = sum(raw.values())
    return {n: w / total for n, w in raw.items()} if total > 0 else {}


def losses(run: Run) -> dict[str, float]:
    """The run's last validation loss of each source (from metrics.jsonl, else summary.json)."""
    row = run.validation[-1] if run.validation else (run.summary or {})
    return {
        k[len(SOURCE_LOSS) :]: v
        for k, v in row.items()
        if k.startswith(SOURCE_LOSS) and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def columns(runs: list[Run]) -> tuple[list[str], list[list[float | None]]]:
    """(the header, one row of values per run): `weight <s>`, `val loss <s>` for each source."""
    ws = [weights(r.experiment) for r in runs]
    ls = [losses(r) for r in runs]
    names = list(dict.fromkeys([*(n for w in ws for n in w), *(n for one in ls for n in one)]))
    header = [c for n in names for c in (WEIGHT + n, LOSS + n)]
    rows = [[v for n in names for v in (w.get(n), one.get(n))] for w, one in zip(ws, ls, strict=True)]
    return header, rows


def compared(a: Run, b: Run) -> list[tuple[str, float | None, float | None]]:
    """`report A B`'s rows of the sources' validation losses: (`val loss <s>`, A's, B's) for every
    source either run validated."""
    la, lb = losses(a), losses(b)
    return [(LOSS + n, la.get(n), lb.get(n)) for n in dict.fromkeys([*la, *lb])]

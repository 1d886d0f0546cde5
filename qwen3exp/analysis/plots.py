"""The plots of a report: loss against step (`loss.png`, validation loss dashed) and tokens/s
against step (`throughput.png`), one curve per run in one colour per run across both.

Each PNG carries `Software: qwen3exp report` in its metadata (a tEXt chunk before the image data):
`report` replaces a plot only when it finds this mark (it never overwrites a user's file).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from qwen3exp.analysis.diff import show
from qwen3exp.analysis.runs import Run

if TYPE_CHECKING:
    from qwen3exp.analysis.report_table import Table

SOFTWARE = "qwen3exp report"
"""The PNG metadata `Software` value that marks a plot as written by `report`."""
PNG_MARK = b"tEXtSoftware\x00" + SOFTWARE.encode()


def curve_labels(t: Table) -> list[str]:
    """Each run's varied values (`lr=0.001 seed=1`), short key names where they are unambiguous."""
    if not t.varied:
        return [row[0] for row in t.rows]
    tails = [k.rsplit(".", 1)[-1] for k in t.varied]
    names = tails if len(set(tails)) == len(tails) else t.varied
    return [
        " ".join(f"{n}={show(v)}" for n, v in zip(names, row[1 : 1 + len(t.varied)], strict=True)) for row in t.rows
    ]


def curves(t: Table) -> list[tuple[Run, str, str]]:
    """(run, label, colour) of every run that logged metrics, in the table's order: loss.png and
    throughput.png give a run the same colour (matplotlib's cycle, C0, C1, ...)."""
    plotted = [(r, label) for r, label in zip(t.runs, curve_labels(t), strict=True) if r.metrics]
    return [(r, label, f"C{i % 10}") for i, (r, label) in enumerate(plotted)]


def _figure():
    import matplotlib  # lazy: slow to import; only when a report draws its plots

    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # lazy: after the Agg backend is chosen

    fig = Figure(figsize=(8, 5), layout="constrained")
    return fig, fig.add_subplot()


def _finish(fig, ax, path: Path, *, ylabel: str, title: str) -> None:
    from matplotlib.ticker import MaxNLocator  # lazy: slow to import; only when plots are drawn

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if ax.get_lines():
        ax.legend(fontsize=7 if len(ax.get_lines()) > 6 else 9, ncol=1 + len(ax.get_lines()) // 12)
    fig.savefig(path, dpi=110, metadata={"Software": SOFTWARE})


def _by(t: Table) -> str:
    return f" by {', '.join(t.varied)}" if t.varied else ""


def plot_losses(t: Table, path: Path):
    """Loss against step, one curve per run that logged metrics (validation loss dashed in the run's
    colour); saved as PNG. Returns the figure."""
    fig, ax = _figure()
    for run, label, colour in curves(t):
        points = [(m["step"], m["loss"]) for m in run.metrics if m.get("loss") is not None]
        if not points:
            continue
        steps, losses = zip(*points, strict=True)
        ax.plot(steps, losses, label=label, color=colour, marker="o" if len(points) <= 20 else None, markersize=3)
        val = [(m["step"], m["val_loss"]) for m in run.validation if m.get("val_loss") is not None]
        if val:
            vs, vl = zip(*val, strict=True)
            ax.plot(vs, vl, linestyle="--", marker="s", markersize=3, color=colour, label=f"{label} (validation)")
    _finish(fig, ax, path, ylabel="loss", title="loss (dashed: validation)" + _by(t))
    return fig


def plot_throughput(t: Table, path: Path):
    """Tokens/s against step, one curve per run that logged it, from 0 up (a slower run is not drawn
    as a cliff); each run's legend entry carries its mean after the first step (the table's
    tokens/s: the first step pays for warm-up). Saved as PNG; returns the figure."""
    fig, ax = _figure()
    for run, label, colour in curves(t):
        points = [(m["step"], m["tokens_per_second"]) for m in run.metrics if m.get("tokens_per_second") is not None]
        if not points:
            continue
        steps, tps = zip(*points, strict=True)
        mean = run.tokens_per_second
        ax.plot(
            steps,
            tps,
            color=colour,
            marker="o" if len(points) <= 20 else None,
            markersize=3,
            label=label if mean is None else f"{label} (mean {mean:,.0f})",
        )
    ax.set_ylim(bottom=0)
    _finish(fig, ax, path, ylabel="tokens/s", title="throughput (legend: mean tokens/s after step 1)" + _by(t))
    return fig

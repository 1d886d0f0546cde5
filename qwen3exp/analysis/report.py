"""`python -m qwen3exp.analysis.report PATH`: what a run, a sweep or a folder of runs did.

One row per run: the keys that differ between the runs' resolved experiments (the "varied keys"),
then status, steps, final loss, validation loss, tokens/s, peak memory and wall time. Runs that
recorded an objective (`sweep.objective`, in summary.json) are ranked by it, best first, and the
best is named with the command that reruns it. Printed as a terminal table (default), Markdown or
CSV (`--format`); `report.md`, `report.csv` and `loss.png` (training loss against step, solid, and
validation loss, dashed, one colour per run) are written next to the runs (PATH, or `--out DIR`;
`--no-files` writes nothing). Exit code 2 when PATH holds no run.
"""

from __future__ import annotations

import argparse
import csv
import io
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwen3exp.analysis.diff import show
from qwen3exp.errors import EXIT_CONFIG_ERROR
from qwen3exp.run import objective, rundir

REPORT_MD, REPORT_CSV, LOSS_PNG = "report.md", "report.csv", "loss.png"
METRIC_COLUMNS = ("status", "steps", "final loss", "val loss", "tokens/s", "peak mem GiB", "wall s")


@dataclass
class Run:
    path: Path
    experiment: dict
    """The resolved experiment (plain, nested)."""
    summary: dict | None
    metrics: list[dict] = field(default_factory=list)
    validation: list[dict] = field(default_factory=list)
    """The validation rows of metrics.jsonl (step, val_loss, val_perplexity)."""

    @property
    def status(self) -> str:
        if self.summary:
            return str(self.summary.get("status"))
        return "incomplete" if rundir.looks_like_run(self.path) else "not run"

    @property
    def steps(self) -> int | None:
        if self.summary and self.summary.get("steps_completed") is not None:
            return self.summary["steps_completed"]
        return self.metrics[-1]["step"] if self.metrics else None

    @property
    def final_loss(self) -> float | None:
        if self.metrics:
            return self.metrics[-1].get("loss")
        return self.summary.get("last_loss") if self.summary else None

    @property
    def val_loss(self) -> float | None:
        if self.validation:
            return self.validation[-1].get("val_loss")
        return self.summary.get("val_loss") if self.summary else None

    @property
    def tokens_per_second(self) -> float | None:
        """Mean over the logged steps after the first (the first pays for warm-up)."""
        return objective.mean_tokens_per_second(self.metrics)

    @property
    def objective(self) -> tuple[str, str] | None:
        """(metric, direction) the run recorded (`sweep.objective`), if any."""
        obj = self.summary.get("objective") if self.summary else None
        if isinstance(obj, dict) and obj.get("metric") and obj.get("direction") in ("minimize", "maximize"):
            return str(obj["metric"]), str(obj["direction"])
        return None

    @property
    def objective_value(self) -> float | None:
        return objective.of_summary(self.summary)

    @property
    def peak_memory_gib(self) -> float | None:
        values = [m["memory_gib"] for m in self.metrics if m.get("memory_gib") is not None]
        return max(values) if values else None

    @property
    def wall_seconds(self) -> float | None:
        return self.summary.get("wall_seconds") if self.summary else None


def load_run(path: Path, *, experiment: dict | None = None) -> Run:
    path = Path(path)
    summary = rundir.read_json(path / rundir.SUMMARY)
    return Run(path, experiment if experiment is not None else rundir.read_experiment(path) or {},
               summary if isinstance(summary, dict) else None, rundir.read_metrics(path),
               rundir.read_validation(path))


def varied_keys(runs: list[Run]) -> list[str]:
    """Dotted keys whose resolved values are not the same in every run (keys missing in some runs
    count as differing)."""
    flat = [rundir.flatten(r.experiment) for r in runs]
    keys = sorted({k for f in flat for k in f})
    return [k for k in keys if len({repr(f.get(k, "\0absent")) for f in flat}) > 1]


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
    varied = varied_keys(runs) if len(runs) > 1 else []
    status = status or {}
    rank = ranking(runs) if len(runs) > 1 else None
    if rank is not None:
        key = objective.better(rank[1])
        runs = sorted(runs, key=lambda r: key(r.objective_value))
    rows = []
    for r in runs:
        flat = rundir.flatten(r.experiment)
        rows.append([_label(r.path, root), *(flat.get(k) for k in varied), status.get(r.path, r.status),
                     r.steps, r.final_loss, r.val_loss, r.tokens_per_second, r.peak_memory_gib, r.wall_seconds])
    return Table(["run", *varied, *METRIC_COLUMNS], rows, runs, varied, rank)


def best_line(t: Table) -> str | None:
    """`best: ... (val_loss 5.8123, minimized); rerun it: qwen3exp relaunch RUN` or None."""
    best = t.best
    if best is None or t.objective is None:
        return None
    flat = rundir.flatten(best.experiment)
    point = " ".join(f"{k}={show(flat.get(k))}" for k in t.varied) or str(best.path)
    metric, direction = t.objective
    return (f"best by {metric} ({direction}d): {point}  {metric} {best.objective_value:.6g}\n"
            f"  rerun it: qwen3exp relaunch {shlex.quote(str(best.path))}")


def _label(path: Path, root: Path | None) -> str:
    if root is not None:
        try:
            rel = Path(path).resolve().relative_to(Path(root).resolve())
            if str(rel) != ".":
                return str(rel)
        except ValueError:
            pass
    return Path(path).name


_FORMATS = {"final loss": "{:.4f}", "val loss": "{:.4f}", "tokens/s": "{:,.0f}", "peak mem GiB": "{:.2f}",
            "wall s": "{:.1f}"}


def _cell(column: str, value: Any) -> str:
    if value is None:
        return "-"
    if column in _FORMATS and isinstance(value, (int, float)):
        return _FORMATS[column].format(value)
    if column in ("run", "status"):
        return str(value)
    return show(value)


def _cells(t: Table) -> list[list[str]]:
    return [[_cell(c, v) for c, v in zip(t.header, row, strict=True)] for row in t.rows]


def render_terminal(t: Table, *, max_rows: int | None = None, max_cell: int = 48) -> str:
    """An aligned table for one screen. When keys vary, they name the rows and the (long) run folder
    names give way to a row number (`#`); Markdown and CSV keep the folder names."""
    def clip(s: str) -> str:
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
    numeric = {i for i, h in enumerate(t.header) if h in ("steps", *_FORMATS)} | ({0} if t.varied else set())

    def line(row):
        return "  ".join(c.rjust(w) if i in numeric else c.ljust(w)
                         for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()

    out = [line(header), line(["-" * w for w in widths]), *(line(r) for r in cells)]
    if more:
        out.append(f"... {more} more run(s): python -m qwen3exp.analysis.report <dir> --format markdown")
    return "\n".join(out)


def render_markdown(t: Table) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    numeric = {h for h in t.header if h in ("steps", *_FORMATS)}
    out = ["| " + " | ".join(esc(h) for h in t.header) + " |",
           "| " + " | ".join("---:" if h in numeric else "---" for h in t.header) + " |"]
    out += ["| " + " | ".join(esc(c) for c in row) + " |" for row in _cells(t)]
    return "\n".join(out)


def render_csv(t: Table) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(t.header)
    for row in t.rows:
        w.writerow(["" if v is None else v for v in row])
    return buf.getvalue()


def curve_labels(t: Table) -> list[str]:
    """Each run's varied values (`lr=0.001 seed=1`), short key names where they are unambiguous."""
    if not t.varied:
        return [row[0] for row in t.rows]
    tails = [k.rsplit(".", 1)[-1] for k in t.varied]
    names = tails if len(set(tails)) == len(tails) else t.varied
    return [" ".join(f"{n}={show(v)}" for n, v in zip(names, row[1:1 + len(t.varied)], strict=True)) for row in t.rows]


def plot_losses(t: Table, path: Path):
    """Loss against step, one curve per run that logged metrics; saved as PNG. Returns the figure."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.add_subplot()
    for run, label in zip(t.runs, curve_labels(t), strict=True):
        points = [(m["step"], m["loss"]) for m in run.metrics if m.get("loss") is not None]
        if not points:
            continue
        steps, losses = zip(*points, strict=True)
        (line,) = ax.plot(steps, losses, label=label, marker="o" if len(points) <= 20 else None, markersize=3)
        val = [(m["step"], m["val_loss"]) for m in run.validation if m.get("val_loss") is not None]
        if val:
            vs, vl = zip(*val, strict=True)
            ax.plot(vs, vl, linestyle="--", marker="s", markersize=3, color=line.get_color(),
                    label=f"{label} (validation)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("loss (dashed: validation)" + (f" by {', '.join(t.varied)}" if t.varied else ""), fontsize=10)
    ax.grid(alpha=0.3)
    if ax.get_lines():
        ax.legend(fontsize=7 if len(ax.get_lines()) > 6 else 9, ncol=1 + len(ax.get_lines()) // 12)
    fig.savefig(path, dpi=110)
    return fig


def write_files(runs: list[Run], out_dir: Path, *, root: Path | None = None,
                status: dict[Path, str] | None = None) -> list[Path]:
    t = table(runs, root=root, status=status)
    out_dir = Path(out_dir)
    best = best_line(t)
    note = f"\n\nRanked by {t.objective[0]} ({t.objective[1]}d), best first. " if t.objective else ""
    if best is not None:
        head, rerun = best.split("\n", 1)
        note += f"{head[0].upper()}{head[1:]}; {rerun.strip()}"
    rundir.atomic_write_text(out_dir / REPORT_MD, render_markdown(t) + note.rstrip() + "\n")
    rundir.atomic_write_text(out_dir / REPORT_CSV, render_csv(t))
    plot_losses(t, out_dir / LOSS_PNG)
    return [out_dir / REPORT_MD, out_dir / REPORT_CSV, out_dir / LOSS_PNG]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m qwen3exp.analysis.report", description=__doc__.split("\n\n")[0])
    ap.add_argument("path", type=Path, help="a run directory, a sweep directory or a folder of runs")
    ap.add_argument("--format", choices=("terminal", "markdown", "csv"), default="terminal",
                    help="what is printed on stdout (default: terminal)")
    ap.add_argument("--out", type=Path, default=None, help="where report.md, report.csv, loss.png go (default: PATH)")
    ap.add_argument("--no-files", action="store_true", help="print only; write no files")
    args = ap.parse_args(argv)
    paths = rundir.find_runs(args.path) if args.path.is_dir() else []
    if not paths:
        print(f"qwen3exp.analysis.report: no run under {args.path} (a run directory holds {rundir.EXPERIMENT} "
              f"or {rundir.SUMMARY})", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    runs = [load_run(p) for p in paths]
    t = table(runs, root=args.path)
    match args.format:
        case "terminal":
            print(render_terminal(t))
            if (line := best_line(t)) is not None:
                print(line)
        case "markdown":
            print(render_markdown(t))
        case "csv":
            sys.stdout.write(render_csv(t))
    if not args.no_files:
        out = args.out or (args.path if args.path.is_dir() else args.path.parent)
        out.mkdir(parents=True, exist_ok=True)
        written = write_files(runs, out, root=args.path)
        curves = sum(1 for r in runs if r.metrics)
        print(f"wrote {', '.join(str(p) for p in written)} ({curves} loss curve(s))", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

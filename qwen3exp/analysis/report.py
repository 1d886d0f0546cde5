"""`python -m qwen3exp.analysis.report PATH [PATH ...]`: what runs, sweeps or folders of runs did.

One row per run: the keys that differ between the runs' resolved experiments (the "varied keys"),
then status, steps, final loss, validation loss, tokens/s, peak memory and wall time. Runs that
recorded an objective (`sweep.objective`, in summary.json) are ranked by it, best first, and the
best is named with the command that reruns it. Several PATHs make one table of all their runs;
exactly two runs also get a comparison: the experiment keys that differ (`qwen3exp diff`'s) and the
final metrics side by side with B - A and B / A (A: the first run, B: the second). Printed as a
terminal table (default), Markdown or CSV (`--format`); `report.md`, `report.csv`, `loss.png`
(training loss against step, solid, and validation loss, dashed, one colour per run) and
`throughput.png` (tokens/s against step, the same colours) are written next to the runs (one PATH:
PATH; several: only with `--out DIR`; `--no-files` writes nothing). Exit code 2 when a PATH holds no run.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwen3exp.analysis.diff import show
from qwen3exp.errors import EXIT_CONFIG_ERROR
from qwen3exp.run import objective, rundir
from qwen3exp.run.identity import differences

REPORT_MD, REPORT_CSV, LOSS_PNG, THROUGHPUT_PNG = "report.md", "report.csv", "loss.png", "throughput.png"
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


def _esc(s: str) -> str:
    """A Markdown table cell: `|` escaped."""
    return s.replace("|", "\\|")


def render_markdown(t: Table) -> str:
    numeric = {h for h in t.header if h in ("steps", *_FORMATS)}
    out = ["| " + " | ".join(_esc(h) for h in t.header) + " |",
           "| " + " | ".join("---:" if h in numeric else "---" for h in t.header) + " |"]
    out += ["| " + " | ".join(_esc(c) for c in row) + " |" for row in _cells(t)]
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


def curves(t: Table) -> list[tuple[Run, str, str]]:
    """(run, label, colour) of every run that logged metrics, in the table's order: loss.png and
    throughput.png give a run the same colour (matplotlib's cycle, C0, C1, ...)."""
    plotted = [(r, label) for r, label in zip(t.runs, curve_labels(t), strict=True) if r.metrics]
    return [(r, label, f"C{i % 10}") for i, (r, label) in enumerate(plotted)]


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5), layout="constrained")
    return fig, fig.add_subplot()


def _finish(fig, ax, path: Path, *, ylabel: str, title: str) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if ax.get_lines():
        ax.legend(fontsize=7 if len(ax.get_lines()) > 6 else 9, ncol=1 + len(ax.get_lines()) // 12)
    fig.savefig(path, dpi=110)


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
        ax.plot(steps, tps, color=colour, marker="o" if len(points) <= 20 else None, markersize=3,
                label=label if mean is None else f"{label} (mean {mean:,.0f})")
    ax.set_ylim(bottom=0)
    _finish(fig, ax, path, ylabel="tokens/s",
            title="throughput (legend: mean tokens/s after step 1)" + _by(t))
    return fig


# ------------------------------------------------------------------------- two runs side by side
COMPARED = (("steps", "steps"), ("final loss", "final_loss"), ("val loss", "val_loss"),
            ("tokens/s", "tokens_per_second"), ("peak mem GiB", "peak_memory_gib"), ("wall s", "wall_seconds"))
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
    """B against A: the resolved experiment keys that differ and the final metrics side by side."""
    return Comparison(a, b, differences(a.experiment, b.experiment),
                      [(column, getattr(a, attr), getattr(b, attr)) for column, attr in COMPARED])


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def delta(column: str, va: Any, vb: Any) -> str:
    """B - A, signed, in the column's format ("-" when either is missing)."""
    if not (_number(va) and _number(vb)):
        return "-"
    d = vb - va
    if column == "steps" and isinstance(d, int):
        return f"{d:+d}"
    return _FORMATS.get(column, "{:.6g}").replace("{:", "{:+").format(d)


def ratio(va: Any, vb: Any) -> str:
    """B / A as `0.982x` ("-" when either is missing or A is 0)."""
    if not (_number(va) and _number(vb)) or va == 0:
        return "-"
    return f"{vb / va:.3f}x"


def _metric_rows(c: Comparison) -> list[list[str]]:
    return [[column, _cell(column, va), _cell(column, vb), delta(column, va, vb), ratio(va, vb)]
            for column, va, vb in c.metrics]


def render_comparison(c: Comparison) -> str:
    """The comparison block of the terminal report."""
    out = [f"B vs A:  A = {c.a.path}", f"         B = {c.b.path}"]
    if c.changes:
        width = max(len(k) for k, _, _ in c.changes)
        out.append("experiment keys that differ (A -> B):")
        out += [f"  {key:<{width}}  {show(va)} -> {show(vb)}" for key, va, vb in c.changes]
    else:
        out.append("identical resolved experiments")
    rows = [["", "A", "B", "B - A", "B / A"], *_metric_rows(c)]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    out.append("final metrics:")
    for r in rows:
        out.append("  " + "  ".join(x.ljust(w) if i == 0 else x.rjust(w)
                                    for i, (x, w) in enumerate(zip(r, widths, strict=True))))
    return "\n".join(line.rstrip() for line in out)


def render_comparison_markdown(c: Comparison) -> str:
    """The comparison section of report.md (and of `--format markdown`)."""
    out = ["## B vs A", "", f"A: `{c.a.path}`, B: `{c.b.path}`", ""]
    if c.changes:
        out += ["| key | A | B |", "| --- | --- | --- |"]
        out += [f"| {_esc(k)} | {_esc(show(va))} | {_esc(show(vb))} |" for k, va, vb in c.changes]
    else:
        out.append("Identical resolved experiments.")
    out += ["", "| metric | A | B | B - A | B / A |", "| --- | ---: | ---: | ---: | ---: |"]
    out += ["| " + " | ".join(_esc(x) for x in row) + " |" for row in _metric_rows(c)]
    return "\n".join(out)


# ----------------------------------------------------------------------------------- the files
def write_files(runs: list[Run], out_dir: Path, *, root: Path | None = None,
                status: dict[Path, str] | None = None) -> list[Path]:
    """report.md (with the comparison when there are exactly two runs: B = runs[1] vs A = runs[0]),
    report.csv, loss.png and throughput.png in `out_dir`; returns their paths."""
    t = table(runs, root=root, status=status)
    out_dir = Path(out_dir)
    best = best_line(t)
    note = f"\n\nRanked by {t.objective[0]} ({t.objective[1]}d), best first. " if t.objective else ""
    if best is not None:
        head, rerun = best.split("\n", 1)
        note += f"{head[0].upper()}{head[1:]}; {rerun.strip()}"
    if len(runs) == 2:
        note += "\n\n" + render_comparison_markdown(compare(*runs))
    rundir.atomic_write_text(out_dir / REPORT_MD, render_markdown(t) + note.rstrip() + "\n")
    rundir.atomic_write_text(out_dir / REPORT_CSV, render_csv(t))
    plot_losses(t, out_dir / LOSS_PNG)
    plot_throughput(t, out_dir / THROUGHPUT_PNG)
    return [out_dir / REPORT_MD, out_dir / REPORT_CSV, out_dir / LOSS_PNG, out_dir / THROUGHPUT_PNG]


# -------------------------------------------------------------------------------- the command
def collect(paths: list[Path]) -> tuple[list[Path], list[str]]:
    """The runs under every PATH, in the order given (each PATH's in natural order; a run found twice
    counts once), and one line per PATH that is not a directory or holds no run."""
    found: dict[Path, Path] = {}
    problems = []
    for path in paths:
        if not path.exists():
            problems.append(f"{path}: no such directory")
            continue
        if not path.is_dir():
            problems.append(f"{path}: not a directory (give a run directory, a sweep directory or a folder of runs)")
            continue
        runs = rundir.find_runs(path)
        if not runs:
            problems.append(f"{path}: no run there (a run directory holds {rundir.EXPERIMENT} or {rundir.SUMMARY})")
        for run in runs:
            found.setdefault(run.resolve(), run)
    return list(found.values()), problems


def label_root(paths: list[Path]) -> Path:
    """What the runs' labels are relative to: the one PATH, or the folder several PATHs share."""
    if len(paths) == 1:
        return paths[0]
    return Path(os.path.commonpath([str(p.resolve()) for p in paths]))


PROG = "python -m qwen3exp.analysis.report"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", type=Path, nargs="+", metavar="PATH",
                    help="a run directory, a sweep directory or a folder of runs; several make one table "
                         "of all their runs, and exactly two runs are compared (B, the second, vs A)")
    ap.add_argument("--format", choices=("terminal", "markdown", "csv"), default="terminal",
                    help="what is printed on stdout (default: terminal)")
    ap.add_argument("--out", type=Path, default=None, metavar="DIR",
                    help=f"where {REPORT_MD}, {REPORT_CSV}, {LOSS_PNG}, {THROUGHPUT_PNG} go (default: PATH when there "
                         "is one; with several PATHs files are written only when --out is given)")
    ap.add_argument("--no-files", action="store_true", help="print only; write no files")
    return ap


def render(t: Table, pair: Comparison | None, fmt: str) -> str:
    """What is printed on stdout: the table (terminal: with the best run), then the comparison."""
    if fmt == "csv":
        return render_csv(t)
    if fmt == "markdown":
        text, comparison = render_markdown(t), render_comparison_markdown(pair) if pair else None
    else:
        best = best_line(t)
        text = render_terminal(t) + (f"\n{best}" if best else "")
        comparison = render_comparison(pair) if pair else None
    return text + (f"\n\n{comparison}" if comparison else "") + "\n"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    paths, problems = collect(args.paths)
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        problems.append(f"--out {args.out}: not a directory")
    for problem in problems:
        print(f"{PROG}: {problem}", file=sys.stderr)
    if problems:
        return EXIT_CONFIG_ERROR
    runs = [load_run(p) for p in paths]
    root = label_root(args.paths)
    t = table(runs, root=root)
    sys.stdout.write(render(t, compare(*runs) if len(runs) == 2 else None, args.format))
    out = args.out or (args.paths[0] if len(args.paths) == 1 else None)
    if args.no_files:
        return 0
    if out is None:
        print(f"{PROG}: no files written: with several paths, --out DIR writes {REPORT_MD}, {REPORT_CSV}, "
              f"{LOSS_PNG} and {THROUGHPUT_PNG} there", file=sys.stderr)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    written = write_files(runs, out, root=root)
    losses = sum(1 for r in runs if any(m.get("loss") is not None for m in r.metrics))
    tps = sum(1 for r in runs if any(m.get("tokens_per_second") is not None for m in r.metrics))
    print(f"wrote {', '.join(str(p) for p in written)} ({losses} loss curve(s), {tps} tokens/s curve(s))",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

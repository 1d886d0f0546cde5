"""`python -m qwen3exp.analysis.report PATH [PATH ...]`: what runs, sweeps or folders of runs did.

One row per run: the keys that differ between the runs' resolved experiments (the "varied keys"),
then status, steps, final loss, validation loss, tokens/s, the plan's per-rank memory next to the
peak the ranks measured and their ratio (`qwen3exp.run.scorecard`), and wall time. Runs that
recorded an objective (`sweep.objective`, in summary.json) are ranked by it, best first, and the
best is named with the command that reruns it. Several PATHs make one table of all their runs;
exactly two runs also get a comparison: the experiment keys that differ (`qwen3exp diff`'s) and the
final metrics side by side with B - A and B / A (A: the first run, B: the second). Printed as a
terminal table (default), Markdown or CSV (`--format`); `report.md`, `report.csv`, `loss.png`
(training loss against step, solid, and validation loss, dashed, one colour per run) and
`throughput.png` (tokens/s against step, the same colours) are written next to the runs (one PATH:
PATH; several: only with `--out DIR`; `--no-files` writes nothing). Exit code 2 when a PATH holds no run.

Run directories are read as data (`qwen3exp.analysis.runs`): a recorded file that is not readable
as plain data (a FIFO, a dangling link, too large or too deep, not JSON: a summary.json cut in half)
is named on stderr and its run listed with status `unreadable` while the other runs are reported
(exit 2 only when no run is readable); a metrics.jsonl line that is no metrics row is left out and
named on stderr. `report.md` starts with
MARK, and a report file that `report` did not write (report.md without MARK, a report.csv without
its header, a PNG without its metadata, a link, a FIFO) is never replaced: exit 2 before printing.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from qwen3exp.analysis.compare import Comparison, compare, render_comparison, render_comparison_markdown
from qwen3exp.analysis.plots import PNG_MARK, plot_losses, plot_throughput
from qwen3exp.analysis.report_table import (
    EARLIER_METRIC_COLUMNS,
    METRIC_COLUMNS,
    Table,
    best_line,
    render_csv,
    render_markdown,
    render_terminal,
    table,
)
from qwen3exp.analysis.runs import Run, load_run
from qwen3exp.errors import EXIT_CONFIG_ERROR, printable
from qwen3exp.run import records, rundir

REPORT_MD, REPORT_CSV, LOSS_PNG, THROUGHPUT_PNG = "report.md", "report.csv", "loss.png", "throughput.png"


# ----------------------------------------------------------------------------------- the files
MARK = "<!-- written by qwen3exp report, which replaces this file; delete this line to keep it as it is -->"
"""The first line of report.md: `report` replaces a report.md only when it starts with this line."""
FILES = (REPORT_MD, REPORT_CSV, LOSS_PNG, THROUGHPUT_PNG)


class NotOurs(Exception):
    """Report files in the output folder that `report` did not write: it never replaces them."""

    def __init__(self, names: list[str], out_dir: Path) -> None:
        self.names = names
        super().__init__(
            f"{out_dir} holds {', '.join(names)}, not written by qwen3exp report (never replaced); "
            "write the report elsewhere with --out DIR, or print it only with --no-files"
        )


def _written_by_report(path: Path) -> bool:
    """Whether the file at `path` is one `report` wrote (true when there is none): report.md by its
    first line (MARK), report.csv by its header, a plot by its PNG metadata. A link, a FIFO or a
    folder is never one."""
    if not os.path.lexists(path):
        return True
    try:
        head = records.read_head(path, 4096)
    except records.Unreadable:
        return False
    if path.name == REPORT_MD:
        return head.startswith(MARK.encode() + b"\n")
    if path.name == REPORT_CSV:
        first = head.split(b"\n", 1)[0].decode("utf-8", "replace")
        return first.startswith("run,") and any(
            first.endswith(",".join(columns)) for columns in (METRIC_COLUMNS, *EARLIER_METRIC_COLUMNS)
        )
    return head.startswith(PNG) and PNG_MARK in head


PNG = b"\x89PNG\r\n\x1a\n"


def foreign_files(out_dir: Path) -> list[str]:
    """The report files in `out_dir` that `report` did not write."""
    return [name for name in FILES if not _written_by_report(Path(out_dir) / name)]


def write_files(
    runs: list[Run], out_dir: Path, *, root: Path | None = None, status: dict[Path, str] | None = None
) -> list[Path]:
    """report.md (with the comparison when there are exactly two runs: B = runs[1] vs A = runs[0]),
    report.csv, loss.png and throughput.png in `out_dir`; returns their paths. Raises NotOurs (and
    writes nothing) when `out_dir` holds one of them that `report` did not write."""
    out_dir = Path(out_dir)
    if foreign := foreign_files(out_dir):
        raise NotOurs(foreign, out_dir)
    t = table(runs, root=root, status=status)
    best = best_line(t)
    note = f"\n\nRanked by {t.objective[0]} ({t.objective[1]}d), best first. " if t.objective else ""
    if best is not None:
        head, rerun = best.split("\n", 1)
        note += f"{head[0].upper()}{head[1:]}; {rerun.strip()}"
    if (pair := comparison(runs)) is not None:
        note += "\n\n" + render_comparison_markdown(pair)
    rundir.atomic_write_text(out_dir / REPORT_MD, MARK + "\n\n" + render_markdown(t) + note.rstrip() + "\n")
    rundir.atomic_write_text(out_dir / REPORT_CSV, render_csv(t))
    plot_losses(t, out_dir / LOSS_PNG)
    plot_throughput(t, out_dir / THROUGHPUT_PNG)
    return [out_dir / name for name in FILES]


# -------------------------------------------------------------------------------- the command
def collect(paths: list[Path]) -> tuple[list[Path], list[str]]:
    """The runs under every PATH, in the order given (each PATH's in natural order; a run found twice
    counts once), and one line per PATH that is not a directory or holds no run."""
    found: dict[Path, Path] = {}
    problems = []
    for path in paths:
        if not path.exists():
            problems.append(
                f"{path}: a link to {os.readlink(path)}, which does not exist"
                if path.is_symlink()
                else f"{path}: no such directory"
            )
            continue
        if not path.is_dir():
            problems.append(f"{path}: not a directory (give a run directory, a sweep directory or a folder of runs)")
            continue
        try:
            runs = rundir.find_runs(path)
        except OSError as e:  # e.g. a folder this user cannot list
            problems.append(f"{path}: cannot be read ({e.strerror or type(e).__name__})")
            continue
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
    ap.add_argument(
        "paths",
        type=Path,
        nargs="+",
        metavar="PATH",
        help="a run directory, a sweep directory or a folder of runs; several make one table "
        "of all their runs, and exactly two runs are compared (B, the second, vs A)",
    )
    ap.add_argument(
        "--format",
        choices=("terminal", "markdown", "csv"),
        default="terminal",
        help="what is printed on stdout (default: terminal)",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"where {REPORT_MD}, {REPORT_CSV}, {LOSS_PNG}, {THROUGHPUT_PNG} go (default: PATH when there "
        "is one; with several PATHs files are written only when --out is given)",
    )
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


def comparison(runs: list[Run]) -> Comparison | None:
    """B vs A for exactly two runs that are both readable (an unreadable one has nothing to compare)."""
    return compare(*runs) if len(runs) == 2 and all(r.readable for r in runs) else None


def _unreadable(runs: list[Run]) -> list[str]:
    """The problems of the unreadable runs, each ending with what `report` does about it: with a
    readable run beside them they are listed as `unreadable`, with none the report is refused."""
    problems = [p for r in runs for p in r.problems]
    if not problems or not any(r.readable for r in runs):
        return problems
    print(
        "\n".join(f"{PROG}: {printable(p)} (its run is listed as unreadable)" for p in problems),
        file=sys.stderr,
    )
    return []


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse printed the usage and the mistake (an unknown option, ...)
        return e.code if isinstance(e.code, int) else EXIT_CONFIG_ERROR
    paths, problems = collect(args.paths)
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        problems.append(f"--out {args.out}: not a directory")
    runs = [load_run(p) for p in paths] if not problems else []
    problems += _unreadable(runs)
    out = None if args.no_files else args.out or (args.paths[0] if len(args.paths) == 1 else None)
    if out is not None and not problems and out.is_dir() and (foreign := foreign_files(out)):
        problems.append(str(NotOurs(foreign, out)))
    for problem in problems:
        print(f"{PROG}: {printable(problem)}", file=sys.stderr)
    if problems:
        return EXIT_CONFIG_ERROR
    for r in runs:
        if r.skipped:
            print(
                f"{PROG}: {r.path / rundir.METRICS}: {len(r.skipped)} line(s) left out, not metrics rows: "
                + printable("; ".join(r.skipped[:3]) + ("; ..." if len(r.skipped) > 3 else "")),
                file=sys.stderr,
            )
    root = label_root(args.paths)
    t = table(runs, root=root)
    sys.stdout.write(render(t, comparison(runs), args.format))
    if args.no_files:
        return 0
    if out is None:
        print(
            f"{PROG}: no files written: with several paths, --out DIR writes {REPORT_MD}, {REPORT_CSV}, "
            f"{LOSS_PNG} and {THROUGHPUT_PNG} there",
            file=sys.stderr,
        )
        return 0
    return _write(runs, out, root)


def _write(runs: list[Run], out: Path, root: Path) -> int:
    try:
        out.mkdir(parents=True, exist_ok=True)
        written = write_files(runs, out, root=root)
    except NotOurs as e:  # appeared since the check
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except OSError as e:  # a read-only folder, a full disk
        why = e.strerror or type(e).__name__
        print(
            f"{PROG}: no report files written: {printable(str(e.filename or out))}: {why}; write them elsewhere "
            "with --out DIR, or print only with --no-files",
            file=sys.stderr,
        )
        return EXIT_CONFIG_ERROR
    losses = sum(1 for r in runs if any(m.get("loss") is not None for m in r.metrics))
    tps = sum(1 for r in runs if any(m.get("tokens_per_second") is not None for m in r.metrics))
    print(
        f"wrote {', '.join(str(p) for p in written)} ({losses} loss curve(s), {tps} tokens/s curve(s))", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

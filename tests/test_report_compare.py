"""`qwen3exp report A B`: several paths make one table, two runs are compared side by side (the
experiment keys that differ, the final metrics with B - A and B / A), and every report plots
tokens/s per run (`throughput.png`) next to the losses (`loss.png`).

Two real tiny trainings (1 rank, 3 steps, training.lr 1e-3 and 3e-3) run once per module, side by
side; the fast tests at the top need no training.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO, read_metrics, read_summary, read_validation, run_cli
from runprocs import Background, env_with

PNG = b"\x89PNG\r\n\x1a\n"
TINY_1RANK = (
    "platform=cpu",
    "platform.threads_per_rank=1",
    "launcher.nproc_per_node=1",
    "training.steps=3",
    "training.warmup_steps=1",
    "training.seq_len=64",
    "training.local_batch_size=2",
    "metrics.tensorboard=false",
)


def _fake_run(path, lr: float, rows: list[dict], summary: dict | None = None):
    """A run directory as a training leaves it (experiment.yaml, metrics.jsonl, summary.json)."""
    from qwen3exp.run import rundir

    path.mkdir(parents=True)
    rundir.atomic_write_text(path / rundir.EXPERIMENT, rundir.experiment_yaml({"training": {"lr": lr, "steps": 2}}))
    rundir.atomic_write_text(path / rundir.METRICS, "".join(json.dumps(r) + "\n" for r in rows))
    if summary is not None:
        rundir.atomic_write_json(path / rundir.SUMMARY, summary)
    return path


# ----------------------------------------------------------------------- fast: no training
def test_bad_paths_are_exit_2_one_line_each(tmp_path):
    good = _fake_run(tmp_path / "good", 1e-3, [{"step": 1, "loss": 3.0, "tokens_per_second": 10.0}])
    empty = tmp_path / "empty"
    empty.mkdir()
    afile = tmp_path / "notes.txt"
    afile.write_text("x")
    missing = tmp_path / "missing"
    r = subprocess.run(
        [sys.executable, "-m", "qwen3exp.analysis.report", str(good), str(missing), str(afile), str(empty)],
        cwd=REPO,
        env=env_with(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = r.stderr.splitlines()
    assert lines == [
        f"python -m qwen3exp.analysis.report: {missing}: no such directory",
        f"python -m qwen3exp.analysis.report: {afile}: not a directory (give a run directory, "
        "a sweep directory or a folder of runs)",
        f"python -m qwen3exp.analysis.report: {empty}: no run there (a run directory holds "
        "experiment.yaml or summary.json)",
    ]
    assert not (good / "report.md").exists()


def test_out_that_is_a_file_is_exit_2(tmp_path, capsys):
    from qwen3exp.analysis import report

    a = _fake_run(tmp_path / "a", 1e-3, [{"step": 1, "loss": 3.0}])
    (tmp_path / "out").write_text("x")
    assert report.main([str(a), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == f"python -m qwen3exp.analysis.report: --out {tmp_path / 'out'}: not a directory\n"


def test_comparison_of_fake_runs_handles_missing_values(tmp_path, capsys):
    from qwen3exp.analysis import compare, report

    a = _fake_run(
        tmp_path / "a",
        1e-3,
        [
            {"step": 1, "loss": 4.0, "tokens_per_second": 100.0, "memory_gib": 1.0},
            {"step": 2, "loss": 3.0, "tokens_per_second": 200.0, "memory_gib": 1.5},
            {"step": 2, "val_loss": 3.5, "val_perplexity": 33.1},
        ],
        {"status": "completed", "steps_completed": 2, "wall_seconds": 10.0},
    )
    b = _fake_run(
        tmp_path / "b",
        2e-3,
        [
            {"step": 1, "loss": 4.0, "tokens_per_second": 50.0, "memory_gib": 1.0},
            {"step": 2, "loss": 2.5, "tokens_per_second": 300.0, "memory_gib": 1.2},
        ],
    )
    c = report.compare(report.load_run(a), report.load_run(b))
    assert c.changes == [("training.lr", 1e-3, 2e-3)]
    rows = {row[0]: row[1:] for row in compare.metric_rows(c)}
    assert rows["final loss"] == ["3.0000", "2.5000", "-0.5000", "0.833x"]
    assert rows["val loss"] == ["3.5000", "-", "-", "-"]  # B has no validation
    assert rows["tokens/s"] == ["200", "300", "+100", "1.500x"]  # the mean after the first step
    assert rows["peak mem GiB"] == ["1.50", "1.20", "-0.30", "0.800x"]
    assert rows["wall s"] == ["10.0", "-", "-", "-"]  # B wrote no summary
    assert rows["steps"] == ["2", "2", "+0", "1.000x"]
    # The command prints it after the table; with several paths and no --out it writes nothing.
    assert report.main([str(a), str(b)]) == 0
    out, err = capsys.readouterr()
    assert (
        f"B vs A:  A = {a}\n         B = {b}\nexperiment keys that differ (A -> B):\n  training.lr  0.001 -> 0.002\n"
    ) in out
    assert "no files written: with several paths, --out DIR writes" in err
    assert not any(p.name.endswith((".md", ".png", ".csv")) for p in tmp_path.rglob("*"))
    # Three runs: one table, no comparison.
    c3 = _fake_run(tmp_path / "c", 3e-3, [{"step": 1, "loss": 4.0}])
    assert report.main([str(a), str(b), str(c3), "--format", "csv"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("run,training.lr,status") and len(out.splitlines()) == 4
    assert "B vs A" not in out


def test_a_summary_cut_in_half_is_listed_as_unreadable_and_the_rest_reported(tmp_path, capsys):
    """A run killed while something wrote its summary.json (qwen3exp writes it atomically; another
    tool, a copy or an old run may not): the report names the file, lists that run as unreadable and
    reports the others, files included; exit 2 only when no run is readable."""
    from qwen3exp.analysis import report

    summary = {"status": "completed", "steps_completed": 2, "wall_seconds": 10.0, "last_loss": 3.0}
    rows = [{"step": 1, "loss": 4.0, "tokens_per_second": 10.0}, {"step": 2, "loss": 3.0}]
    _fake_run(tmp_path / "a", 1e-3, rows, summary)
    _fake_run(tmp_path / "b", 2e-3, [{**r, "loss": r["loss"] - 0.5} for r in rows], summary)
    cut = _fake_run(tmp_path / "cut", 3e-3, rows, summary)
    text = (cut / "summary.json").read_text()
    (cut / "summary.json").write_text(text[: len(text) // 2])
    assert report.main([str(tmp_path), "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    table = {line.split(",")[0]: line.split(",") for line in out.splitlines()[1:]}
    assert table["a"][1:4] == ["0.001", "completed", "2"] and table["b"][1:4] == ["0.002", "completed", "2"]
    assert table["cut"][1:3] == ["0.003", "unreadable"], out
    assert f"{cut / 'summary.json'}: " in err and "(its run is listed as unreadable)" in err
    assert "Traceback" not in err and (tmp_path / "report.md").is_file()
    # Two runs, one unreadable: the table, no comparison; the unreadable one alone: exit 2.
    assert report.main([str(tmp_path / "a"), str(cut), "--no-files"]) == 0
    assert "B vs A" not in capsys.readouterr().out
    assert report.main([str(cut), "--no-files"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and f"{cut / 'summary.json'}: " in err and "listed as unreadable" not in err


# ---------------------------------------------------------------- slow: two real trainings
@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two 3-step trainings on 1 rank each, started together: training.lr 1e-3 (A) and 3e-3 (B)."""
    root = tmp_path_factory.mktemp("compare") / "runs"
    dirs = {"a": root / "lr_low", "b": root / "lr_high"}
    procs = {
        key: Background(*TINY_1RANK, f"training.lr={lr}", f"hydra.run.dir={dirs[key]}", folder=root.parent / key)
        for key, lr in (("a", "1e-3"), ("b", "3e-3"))
    }
    for proc in procs.values():
        r = proc.result(timeout=400)
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return dirs


@pytest.mark.slow
def test_two_runs_side_by_side(pair, tmp_path, capsys):
    a, b = pair["a"], pair["b"]
    out = tmp_path / "cmp"
    r = run_cli(str(a), str(b), "--out", str(out), module="qwen3exp.analysis.report")
    assert r.returncode == 0, r.stderr
    # One table of both runs, the varied key as its column.
    assert r.stdout.splitlines()[0].split()[:2] == ["#", "training.lr"]
    block = r.stdout.split("B vs A:", 1)[1]
    assert block.startswith(f"  A = {a}\n         B = {b}\n")
    keys = block.split("experiment keys that differ (A -> B):\n", 1)[1].split("final metrics:")[0]
    assert keys == "  training.lr  0.001 -> 0.003\n"
    rows = [line.split() for line in block.split("final metrics:\n", 1)[1].splitlines()[1:]]
    metrics = {" ".join(row[:-4]): row[-4:] for row in rows}
    ma, mb = read_metrics(a), read_metrics(b)
    sa, sb = read_summary(a), read_summary(b)
    la, lb = ma[-1]["loss"], mb[-1]["loss"]
    assert metrics["final loss"] == [f"{la:.4f}", f"{lb:.4f}", f"{lb - la:+.4f}", f"{lb / la:.3f}x"]
    va, vb = read_validation(a)[-1]["val_loss"], read_validation(b)[-1]["val_loss"]
    assert metrics["val loss"] == [f"{va:.4f}", f"{vb:.4f}", f"{vb - va:+.4f}", f"{vb / va:.3f}x"]
    ta = sum(m["tokens_per_second"] for m in ma[1:]) / len(ma[1:])
    tb = sum(m["tokens_per_second"] for m in mb[1:]) / len(mb[1:])
    assert metrics["tokens/s"] == [f"{ta:,.0f}", f"{tb:,.0f}", f"{tb - ta:+,.0f}", f"{tb / ta:.3f}x"]
    pa, pb = max(m["memory_gib"] for m in ma), max(m["memory_gib"] for m in mb)
    assert metrics["peak mem GiB"] == [f"{pa:.2f}", f"{pb:.2f}", f"{pb - pa:+.2f}", f"{pb / pa:.3f}x"]
    wa, wb = sa["wall_seconds"], sb["wall_seconds"]
    assert metrics["wall s"] == [f"{wa:.1f}", f"{wb:.1f}", f"{wb - wa:+.1f}", f"{wb / wa:.3f}x"]
    # The files: the comparison in report.md too, both plots.
    names = ("report.md", "report.csv", "loss.png", "throughput.png")
    assert f"wrote {', '.join(str(out / n) for n in names)} (2 loss curve(s), 2 tokens/s curve(s))" in r.stderr
    for png in ("loss.png", "throughput.png"):
        assert (out / png).read_bytes()[:8] == PNG and (out / png).stat().st_size > 10_000
    md = (out / "report.md").read_text()
    assert "## B vs A" in md and "| training.lr | 0.001 | 0.003 |" in md
    assert f"| final loss | {la:.4f} | {lb:.4f} | {lb - la:+.4f} | {lb / la:.3f}x |" in md
    # B vs A is the order of the command line: reversed, the key and the ratios turn around.
    from qwen3exp.analysis import report

    assert report.main([str(b), str(a), "--no-files", "--format", "markdown"]) == 0
    md = capsys.readouterr().out
    assert "| training.lr | 0.003 | 0.001 |" in md
    assert f"| final loss | {lb:.4f} | {la:.4f} | {la - lb:+.4f} | {la / lb:.3f}x |" in md


@pytest.mark.slow
def test_throughput_plot_has_one_line_per_run(pair, tmp_path):
    from qwen3exp.analysis import report

    runs = [report.load_run(pair["a"]), report.load_run(pair["b"])]
    t = report.table(runs, root=pair["a"].parent)
    fig = report.plot_throughput(t, tmp_path / "throughput.png")
    lines = fig.axes[0].get_lines()
    assert len(lines) == 2
    for run, line in zip(t.runs, lines, strict=True):  # the table's order (ranked by val loss)
        assert list(line.get_ydata()) == [m["tokens_per_second"] for m in run.metrics]
        assert list(line.get_xdata()) == [m["step"] for m in run.metrics]
        lr = "0.001" if run.path == pair["a"] else "0.003"
        assert line.get_label() == f"lr={lr} (mean {run.tokens_per_second:,.0f})"
    assert fig.axes[0].get_ylim()[0] == 0 and fig.axes[0].get_ylabel() == "tokens/s"
    # A run has the same colour in both plots.
    losses = [
        ln
        for ln in report.plot_losses(t, tmp_path / "loss.png").axes[0].get_lines()
        if not ln.get_label().endswith("(validation)")
    ]
    assert [ln.get_color() for ln in losses] == [ln.get_color() for ln in lines] == ["C0", "C1"]
    assert (tmp_path / "throughput.png").read_bytes()[:8] == PNG


@pytest.mark.slow
def test_a_folder_of_runs_and_a_run_found_twice(pair, capsys):
    from qwen3exp.analysis import report

    folder = pair["a"].parent
    # One PATH holding two runs: the comparison too (A, B in natural order), files into PATH.
    assert report.main([str(folder), str(pair["b"]), "--no-files"]) == 0  # lr_high is in folder: once
    both = capsys.readouterr().out
    assert report.main([str(folder)]) == 0
    out, err = capsys.readouterr()
    assert out == both
    assert f"B vs A:  A = {pair['b']}\n         B = {pair['a']}\n" in out  # lr_high sorts before lr_low
    assert "training.lr  0.003 -> 0.001" in out
    assert "(2 loss curve(s), 2 tokens/s curve(s))" in err
    assert (folder / "throughput.png").stat().st_size > 10_000 and (folder / "loss.png").stat().st_size > 10_000

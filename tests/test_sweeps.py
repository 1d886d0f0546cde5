"""Sweeps that finish and tell you what happened: validated up front, resumable after Ctrl-C, a
failing job does not stop the sweep, report table + loss plot, diff, provenance, exact relaunch.

The 2 x 2 sweep (experiment=tiny_sweep, training.lr x training.seed) is run once per module: it is
interrupted with a real SIGINT once its second job has finished, then the same command is run again
and must run only the remaining jobs. The other slow tests read that sweep's run directories. The
sweep with a failing job runs beside it (started by a module fixture, checked by its own test).
The trained sweeps run 1 rank per job (launcher.nproc_per_node=1): nothing here is about sharding,
and every job is a torchrun start.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import signal
from pathlib import Path

import pytest

from conftest import REPO, read_metrics, read_summary, run_cli
from runprocs import Background, start_cli, wait_for

ONE_RANK = "launcher.nproc_per_node=1"
SWEEP = ["-m", "experiment=tiny_sweep", ONE_RANK, "training.lr=1e-3,3e-3", "training.seed=1,2"]
POINTS = [("0.001", "1"), ("0.001", "2"), ("0.003", "1"), ("0.003", "2")]


def job_dir(sweep_dir: Path, lr: str, seed: str) -> Path:
    return sweep_dir / f"experiment=tiny_sweep,{ONE_RANK},training.lr={lr},training.seed={seed}"


# ------------------------------------------------------------------------- fast: before any job
def test_safe_dirname():
    from qwen3exp.config.names import safe_dirname

    assert safe_dirname("training.lr=0.001,training.seed=1") == "training.lr=0.001,training.seed=1"
    assert safe_dirname("experiment=tiny_sweep,training.lr=1") == "experiment=tiny_sweep,training.lr=1"
    assert safe_dirname("data.path=/tmp/a b/c.jsonl") == "data.path=%2Ftmp%2Fa%20b%2Fc.jsonl"
    assert safe_dirname("") == "base"
    long = safe_dirname("x=" + "y" * 400)
    assert len(long) <= 200 and long != safe_dirname("x=" + "y" * 399)


def test_broken_point_aborts_sweep_before_any_job(tmp_path):
    sweep_dir = tmp_path / "sweep"
    r = run_cli(
        "-m", "experiment=tiny_sweep", "training.lr=1e-3,-1", "training.seed=1,2", f"hydra.sweep.dir={sweep_dir}"
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    # Both broken points are named, with the key and the value; nothing was started or created.
    for point in (
        "3/4 [experiment=tiny_sweep training.lr=-1 training.seed=1]",
        "4/4 [experiment=tiny_sweep training.lr=-1 training.seed=2]",
    ):
        assert f"configuration error in sweep point {point}" in r.stderr, r.stderr
    assert (
        r.stderr.count(
            "training.lr = -1: Input should be greater than 0\n      allowed: a number > 0.0\n"
            "      from: command line training.lr=-1"
        )
        == 2
    ), r.stderr
    assert not sweep_dir.exists()
    assert "qwen3exp: tiny_sweep:" not in r.stdout


def test_dry_run_shows_each_job_directory(tmp_path):
    r = run_cli(*SWEEP, "dry_run=true", f"hydra.sweep.dir={tmp_path / 's'}")
    assert r.returncode == 0, r.stderr
    for lr, seed in POINTS:
        assert f"run directory: {job_dir(tmp_path / 's', lr, seed)}\n" in r.stdout
    assert not (tmp_path / "s").exists()


def test_wandb_opt_in_is_checked_before_start(tmp_path):
    env = {"HOME": str(tmp_path), "WANDB_MODE": "online", "WANDB_API_KEY": "", "NETRC": str(tmp_path / "none")}
    r = run_cli("metrics.wandb=true", "dry_run=true", env=env)
    assert r.returncode == 2 and "metrics.wandb = True" in r.stderr and "WANDB_MODE=offline" in r.stderr, r.stderr
    r = run_cli("metrics.wandb=true", "dry_run=true", env={**env, "WANDB_MODE": "offline"})
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------ slow: a job that fails
FAILING = ["-m", "experiment=tiny_sweep", ONE_RANK, "training.steps=2", "training.seed=1,2", "metrics.wandb=true"]
"""Point 1 fails in its ranks (an injected error at step 1, only in that job's folder); point 2
still runs. Both use W&B (opt-in) in offline mode."""


@pytest.fixture(scope="module")
def failing(tmp_path_factory):
    """The sweep with a failing job, started before the interrupted sweep (which requests it) so
    that the two run side by side; test_failing_job_is_recorded_and_the_sweep_goes_on collects it."""
    d = tmp_path_factory.mktemp("failing") / "sweep"
    started = Background(
        *FAILING,
        f"hydra.sweep.dir={d}",
        folder=d.parent / "launcher",
        WANDB_MODE="offline",
        QWEN3EXP_FAULT_RAISE_AT_STEP="1",
        QWEN3EXP_FAULT_RUN_MATCH="training.seed=1,",
    )
    yield d, started
    started.stop(d)


# ---------------------------------------------------------------- slow: the interrupted sweep
@pytest.fixture(scope="module")
def sweep(tmp_path_factory, failing):
    """Run the 2 x 2 sweep, SIGINT it once the second job has finished and the third has started
    (its run directory is written), then rerun the same command. (The sweep with a failing job
    runs beside it.)"""
    sweep_dir = tmp_path_factory.mktemp("sweeps") / "lr_x_seed"
    args = [*SWEEP, f"hydra.sweep.dir={sweep_dir}"]
    log = sweep_dir.parent / "first.log"
    proc = start_cli(*args, log=log)
    third = job_dir(sweep_dir, *POINTS[2]) / "experiment.yaml"
    try:
        wait_for(third.exists, proc=proc, timeout=400, what="the third job's start")
    except AssertionError as e:  # the sweep ended first, or took too long: show what it said
        raise AssertionError(f"{e}:\n{log.read_text()[-3000:]}") from None
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    first_out = log.read_text()
    before = {p: (job_dir(sweep_dir, *p) / "summary.json").read_bytes() for p in POINTS[:2]}
    mtimes = {p: (job_dir(sweep_dir, *p) / "metrics.jsonl").stat().st_mtime_ns for p in POINTS[:2]}
    second_run = run_cli(*args)
    return {
        "dir": sweep_dir,
        "first_rc": proc.returncode,
        "first_out": first_out,
        "before": before,
        "mtimes": mtimes,
        "second": second_run,
    }


@pytest.mark.slow
def test_interrupted_sweep_reruns_only_the_remaining_jobs(sweep):
    d, second = sweep["dir"], sweep["second"]
    assert sweep["first_rc"] == 130, sweep["first_out"][-3000:]
    first_table = sweep["first_out"].split("qwen3exp sweep interrupted:")[1]
    assert (
        "2 completed, 1 interrupted, 1 not run" in first_table.splitlines()[0]
        or "2 completed, 1 incomplete, 1 not run" in first_table.splitlines()[0]
    ), first_table
    assert f"hydra.sweep.dir={d}" in sweep["first_out"].split("resume (runs only the")[1]
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resuming: 2 completed earlier (skipped); 1 unfinished" in second.stdout
    # The first two jobs were not run again: their files are untouched.
    for p in POINTS[:2]:
        assert (job_dir(d, *p) / "summary.json").read_bytes() == sweep["before"][p]
        assert (job_dir(d, *p) / "metrics.jsonl").stat().st_mtime_ns == sweep["mtimes"][p]
    launched = [
        line.rsplit("run directory ", 1)[1]
        for line in second.stdout.splitlines()
        if line.startswith("qwen3exp: tiny_sweep: ")
    ]
    assert sorted(launched) == sorted(str(job_dir(d, *p)) for p in POINTS[2:])
    for p in POINTS:
        s = read_summary(job_dir(d, *p))
        assert s["status"] == "completed" and s["steps_completed"] == 5 and len(s["experiment_hash"]) == 64
    # The third job was interrupted mid-run: that attempt is kept, not overwritten.
    kept = job_dir(d, *POINTS[2]) / "attempts" / "1"
    assert (kept / "experiment.yaml").read_text() == (job_dir(d, *POINTS[2]) / "experiment.yaml").read_text()
    assert not (kept / "summary.json").exists() or read_summary(kept)["status"] == "interrupted"
    # The final one-screen summary: 4 rows, the two earlier jobs shown as skipped.
    tail = second.stdout.split("qwen3exp sweep finished:")[1]
    assert "2 skipped (done), 2 completed" in tail.splitlines()[0]
    rows = [line for line in tail.splitlines()[3:7]]
    assert [r.split()[0] for r in rows] == ["1", "2", "3", "4"], tail


@pytest.mark.slow
def test_report_table_has_a_row_per_run_and_the_varied_keys(sweep):
    d = sweep["dir"]
    r = run_cli(str(d), "--format", "csv", module="qwen3exp.analysis.report")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert len(rows) == 4
    assert list(rows[0])[:3] == ["run", "training.lr", "training.seed"]
    assert list(rows[0])[3:] == [
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
    ]
    assert {(row["training.lr"], row["training.seed"]) for row in rows} == set(POINTS)
    for row in rows:
        run = d / row["run"]
        assert row["status"] == "completed" and row["steps"] == "5"
        assert float(row["final loss"]) == read_metrics(run)[-1]["loss"]
        assert float(row["val loss"]) == read_summary(run)["val_loss"]
        assert float(row["tokens/s"]) > 0 and float(row["peak mem GiB"]) > 0 and float(row["wall s"]) > 0
        assert float(row["mem ratio"]) == pytest.approx(float(row["peak mem GiB"]) / float(row["plan mem GiB"]))
        assert float(row["step ratio"].rstrip("x")) == pytest.approx(read_summary(run)["step_time_ratio"], rel=1e-2)
    # Ranked by the objective (the validation loss, minimized), best first.
    assert [float(row["val loss"]) for row in rows] == sorted(float(row["val loss"]) for row in rows)
    md = run_cli(str(d), "--format", "markdown", "--no-files", module="qwen3exp.analysis.report").stdout
    assert md.count(f"| experiment=tiny_sweep,{ONE_RANK},training.lr=") == 4
    report_md = (d / "report.md").read_text()
    # report's mark (report.MARK) and a blank line, header, rule, 4 rows, blank, ranking
    assert report_md.count("\n") == 10 and (d / "report.csv").exists()
    assert "Ranked by val_loss (minimized), best first. Best by val_loss" in report_md
    assert "4 loss curve(s)" in r.stderr


@pytest.mark.slow
def test_loss_plot_has_one_curve_per_run(sweep, tmp_path):
    from qwen3exp.analysis import report
    from qwen3exp.run import rundir

    d = sweep["dir"]
    png = d / "loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    runs = [report.load_run(p) for p in rundir.find_runs(d)]
    fig = report.plot_losses(report.table(runs, root=d), tmp_path / "loss.png")
    lines = [line for line in fig.axes[0].get_lines() if not line.get_label().endswith("(validation)")]
    dashed = [line for line in fig.axes[0].get_lines() if line.get_label().endswith("(validation)")]
    assert len(lines) == 4 and len(dashed) == 4
    assert sorted(line.get_label() for line in lines) == sorted(f"lr={lr} seed={s}" for lr, s in POINTS)
    ranked = report.table(runs, root=d).runs  # the curves follow the table's (ranked) order
    for run, line, val in zip(ranked, lines, dashed, strict=True):
        assert list(line.get_ydata()) == [m["loss"] for m in run.metrics]
        assert list(val.get_ydata()) == [m["val_loss"] for m in run.validation]
        assert val.get_linestyle() == "--" and val.get_color() == line.get_color()
    # The PNG written by the report holds 4 differently coloured curves (matplotlib's first 4 colours).
    import matplotlib.image

    pixels = matplotlib.image.imread(str(png))[..., :3]
    for colour in ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"):
        rgb = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
        close = (abs(pixels - rgb).max(axis=-1) < 0.02).sum()
        assert close > 200, colour


@pytest.mark.slow
def test_diff_names_the_keys_that_differ(sweep):
    d = sweep["dir"]
    a, b = job_dir(d, *POINTS[0]), job_dir(d, *POINTS[3])
    r = run_cli(str(a), str(b), module="qwen3exp.analysis.diff")
    assert r.returncode == 1
    assert [line.split()[0] for line in r.stdout.splitlines()] == ["training.lr", "training.seed"]
    assert "0.001 -> 0.003" in r.stdout and "1 -> 2" in r.stdout
    same = run_cli(str(a), str(a), "--provenance", module="qwen3exp.analysis.diff")
    assert same.returncode == 0 and "identical" in same.stdout
    assert run_cli(str(a), str(d), module="qwen3exp.analysis.diff").returncode == 2


@pytest.mark.slow
def test_provenance_and_tensorboard_in_every_run(sweep):
    d = sweep["dir"]
    for lr, seed in POINTS:
        run = job_dir(d, lr, seed)
        prov = json.loads((run / "provenance.json").read_text())
        assert len(prov["git"]["commit"]) == 40 and isinstance(prov["git"]["dirty"], bool)
        assert (run / "git.diff").exists() == prov["git"]["dirty"]
        for pkg in ("python", "torch", "torchtitan", "transformers"):
            assert prov["versions"][pkg]
        assert prov["platform"]["name"] == "cpu" and prov["platform"]["devices"]
        assert prov["hostname"] and prov["rank_env"]["OMP_NUM_THREADS"]
        assert prov["command"][1:] == ["-m", "qwen3exp", *SWEEP, f"hydra.sweep.dir={d}"]
        assert f"training.lr={lr}" in prov["hydra"]["task_overrides"]
        assert prov["hydra"]["mode"] == "MULTIRUN" and prov["experiment_hash"] == read_summary(run)["experiment_hash"]
        assert all(v == "***" for k, v in prov["env"].items() if "TOKEN" in k or "KEY" in k)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = list(job_dir(d, *POINTS[0]).glob("tb/*/events.out.tfevents.*"))
    assert len(events) == 1
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss_metrics/global_avg_loss")] == [1, 2, 3, 4, 5]


@pytest.mark.slow
def test_changed_base_config_is_refused_before_any_job(sweep, tmp_path):
    d = sweep["dir"]
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    text = (conf / "config.yaml").read_text()
    assert "\nhydra:\n" in text and "max_norm" not in text  # the schema's default, 1.0, holds
    (conf / "config.yaml").write_text(text.replace("\nhydra:\n", "\ntraining:\n  max_norm: 0.5\n\nhydra:\n", 1))
    before = sorted(str(p) for p in d.rglob("*"))
    r = run_cli("--config-path", str(conf), *SWEEP, f"hydra.sweep.dir={d}")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "holds a run of a different experiment" in r.stderr
    assert "training.max_norm: 1.0 -> 0.5" in r.stderr and "Traceback" not in r.stderr
    assert sorted(str(p) for p in d.rglob("*")) == before


@pytest.mark.slow
def test_dry_run_of_a_finished_sweep_would_skip_every_job(sweep):
    r = run_cli(*SWEEP, f"hydra.sweep.dir={sweep['dir']}", "dry_run=true")
    assert r.returncode == 0, r.stderr
    assert "resuming: 4 completed earlier (skipped)" in r.stdout


@pytest.mark.slow
def test_relaunch_from_a_run_directory_reproduces_the_losses(sweep, tmp_path):
    original = job_dir(sweep["dir"], *POINTS[3])
    new = tmp_path / "again"
    r = run_cli(str(original), f"hydra.run.dir={new}", module="qwen3exp.analysis.relaunch")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "same resolved experiment as recorded" in r.stdout
    assert [m["loss"] for m in read_metrics(new)] == [m["loss"] for m in read_metrics(original)]
    assert "losses identical" in r.stdout
    assert (new / "experiment.yaml").read_text() == (original / "experiment.yaml").read_text()
    prov = json.loads((new / "provenance.json").read_text())
    assert prov["command"][1:4] == ["-m", "qwen3exp", "relaunch"] and prov["hydra"]["mode"] == "RUN"
    # The plain Hydra form composes the same experiment (checked without training).
    dry = run_cli("--config-path", str(original / ".hydra"), "--config-name", "config", "dry_run=true")
    assert dry.returncode == 0, dry.stderr


# ------------------------------------------------------------------ slow: a job that fails
@pytest.mark.slow
def test_failing_job_is_recorded_and_the_sweep_goes_on(failing):
    """Point 1 fails in its ranks (an injected error at step 1, only in that job's folder); point 2
    still runs. Both use W&B (opt-in) in offline mode, which must leave its files in the run directory."""
    d, started = failing
    r = started.result()
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    # as Hydra's sweeper renders it
    failed = d / f"experiment=tiny_sweep,{ONE_RANK},metrics.wandb=True,training.seed=1,training.steps=2"
    done = d / f"experiment=tiny_sweep,{ONE_RANK},metrics.wandb=True,training.seed=2,training.steps=2"
    assert sorted(p.name for p in d.iterdir() if p.is_dir()) == sorted([failed.name, done.name])
    assert read_summary(failed)["status"] == "failed" and "injected fault" in read_summary(failed)["error"]
    assert read_summary(done)["status"] == "completed" and read_summary(done)["steps_completed"] == 2
    tail = r.stdout.split("qwen3exp sweep finished:")[1]
    assert "1 failed, 1 completed" in tail.splitlines()[0]
    assert f"#2 {failed}: rank" in tail  # ranked: the completed run first
    assert "resume (runs only the 1 unfinished job(s))" in tail
    assert len(list(done.glob("wandb/offline-run-*"))) == 1 and not list(done.glob("tb/*/wandb"))
    assert len(list(done.glob("tb/*/events.out.tfevents.*"))) == 1

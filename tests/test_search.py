"""Sweeps that search: every sweep form goes through the pre-launch check with its real number of
jobs, each job returns its objective to Hydra's sweeper, an Optuna search of the tiny model's
learning rate minimizes the held-out loss and continues after it was stopped, and
`sweep.parallel_jobs` runs local jobs side by side through hydra-joblib-launcher.

Fast tests plan only (dry runs, refusals). The slow ones train the tiny model (1 rank, seq 64, a
handful of steps) through the real pipeline: Hydra, the Optuna sweeper with an SQLite study in the
sweep directory, qwen3exp's launcher, torchrun.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from conftest import read_summary, read_validation, run_cli
from runprocs import Background, start_cli

TINY = ("launcher.nproc_per_node=1", "metrics.tensorboard=false", "training.steps=4", "validation.freq=2")


def _user_conf(tmp_path: Path, name: str, body: str) -> Path:
    conf = tmp_path / "conf"
    (conf / "experiment").mkdir(parents=True, exist_ok=True)
    (conf / "experiment" / f"{name}.yaml").write_text("# @package _global_\n" + body)
    return conf


def _points(out: str) -> int:
    """How many job plans a dry run printed."""
    return out.count("qwen3exp dry run: ")


# ------------------------------------------------------------------------------ fast: the forms
def test_interval_needs_an_adaptive_sweeper(tmp_path):
    d = tmp_path / "sweep"
    r = run_cli("-m", "training.lr=interval(1e-4,1e-2)", f"hydra.sweep.dir={d}")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "training.lr = 'interval(1e-4,1e-2)'" in r.stderr and "hydra/sweeper=optuna" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout and not d.exists()


def test_glob_over_a_config_group_plans_every_option(tmp_path):
    r = run_cli("-m", "model=glob(*)", "dry_run=true", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "qwen3exp sweep: 2 job(s)" in r.stdout and _points(r.stdout) == 2
    assert "sweep/model=hf\n" in r.stdout and "sweep/model=native\n" in r.stdout


def test_glob_point_that_breaks_aborts_before_any_job(tmp_path):
    d = tmp_path / "sweep"
    # model.flavor=4B is a native flavor; the hf option has no such key: one point of two is broken.
    r = run_cli("-m", "model=glob(*)", "+model.flavor=4B", f"hydra.sweep.dir={d}")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "model.flavor" in r.stderr and "Traceback" not in r.stderr
    assert not d.exists() or not any(d.iterdir())


@pytest.mark.parametrize(
    "form,count", [("training.lr=range(1,4)", 3), ("training.seed=choice(1,2)", 2), ("training.seed=1,2,3", 3)]
)
def test_command_line_forms_plan_their_real_count(form, count, tmp_path):
    r = run_cli("-m", form, "dry_run=true", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"qwen3exp sweep: {count} job(s)" in r.stdout and _points(r.stdout) == count


def test_params_in_an_experiment_file_are_the_sweep(tmp_path):
    conf = _user_conf(tmp_path, "grid", "name: grid\nhydra:\n  sweeper:\n    params:\n      training.seed: 1,2,3\n")
    r = run_cli(
        "--config-dir", str(conf), "-m", "experiment=grid", "dry_run=true", f"hydra.sweep.dir={tmp_path / 'sweep'}"
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "qwen3exp sweep: 3 job(s)" in r.stdout and _points(r.stdout) == 3
    # A single run of the same file is one job, as with Hydra, and says so.
    one = run_cli("--config-dir", str(conf), "experiment=grid", "dry_run=true")
    assert one.returncode == 0, one.stderr[-2000:]
    assert _points(one.stdout) == 1 and "this single run ignores it (add -m to sweep)" in one.stderr


def test_a_broken_point_in_the_file_params_aborts_before_any_job(tmp_path):
    conf = _user_conf(tmp_path, "grid", "name: grid\nhydra:\n  sweeper:\n    params:\n      training.lr: 1e-3,-1\n")
    d = tmp_path / "sweep"
    r = run_cli("--config-dir", str(conf), "-m", "experiment=grid", f"hydra.sweep.dir={d}")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "sweep point 2/2" in r.stderr and "training.lr = -1" in r.stderr and "Traceback" not in r.stderr
    assert not d.exists() or not any(d.iterdir())


def test_hydra_mode_multirun_in_the_file_is_a_sweep(tmp_path):
    conf = _user_conf(
        tmp_path, "grid", "name: grid\nhydra:\n  mode: MULTIRUN\n  sweeper:\n    params:\n      training.seed: 1,2\n"
    )
    r = run_cli("--config-dir", str(conf), "experiment=grid", "dry_run=true", f"hydra.sweep.dir={tmp_path / 's'}")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "qwen3exp sweep: 2 job(s)" in r.stdout and _points(r.stdout) == 2


# ------------------------------------------------------------------ fast: an adaptive sweeper
def test_optuna_dry_run_shows_the_space_and_checks_its_ends(tmp_path):
    d = tmp_path / "sweep"
    r = run_cli("-m", "experiment=tiny_search", "dry_run=true", f"hydra.sweep.dir={d}")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "its points are chosen while it runs" in r.stdout
    assert "training.lr                  tag(log, interval(1e-4, 3e-2))" in r.stdout
    assert "4 trial(s), 1 per batch" in r.stdout and "optuna.db" in r.stdout
    assert "checked 2 representative point(s)" in r.stdout and _points(r.stdout) == 1
    assert not d.exists() or not any(d.iterdir())  # a dry run writes nothing
    bad = run_cli(
        "-m", "experiment=tiny_search", "training.lr=interval(-1,1e-2)", "dry_run=true", f"hydra.sweep.dir={d}"
    )
    assert bad.returncode == 2, bad.stdout[-2000:] + bad.stderr[-2000:]
    assert "representative point 1 [training.lr=-1.0]" in bad.stderr and "greater than 0" in bad.stderr


def test_a_search_with_a_refused_end_never_starts_a_trial(tmp_path):
    d = tmp_path / "sweep"
    r = run_cli("-m", "experiment=tiny_search", "training.lr=interval(-1,1e-2)", f"hydra.sweep.dir={d}")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "representative point 1 [training.lr=-1.0]" in r.stderr and "Traceback" not in r.stderr
    assert not d.exists() or not any(d.iterdir())


def test_optuna_direction_must_agree_with_the_objective(tmp_path):
    r = run_cli(
        "-m", "experiment=tiny_search", "sweep.objective=tokens_per_second", f"hydra.sweep.dir={tmp_path / 'sweep'}"
    )
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "hydra.sweeper.direction = 'minimize'" in r.stderr and "hydra.sweeper.direction=maximize" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_failed_job_is_a_failed_trial_for_an_adaptive_sweeper(tmp_path):
    """The launcher's return: the objective from summary.json; no value -> Hydra's failed-job return
    for an adaptive sweeper (Optuna records a failed trial), a completed job without value for
    Hydra's basic sweeper (which would otherwise stop the grid at the first failure)."""
    import json

    from hydra.core.utils import JobReturn, JobStatus

    from qwen3exp.launchers.returns import TrialFailed, for_sweeper as _for_sweeper

    def ret() -> JobReturn:
        r = JobReturn(status=JobStatus.COMPLETED)
        r.return_value = {"status": "?"}
        return r

    ok, bad = tmp_path / "ok", tmp_path / "bad"
    ok.mkdir(), bad.mkdir()
    (ok / "summary.json").write_text(
        json.dumps({"status": "completed", "objective": {"metric": "val_loss", "direction": "minimize", "value": 5.5}})
    )
    (bad / "summary.json").write_text(
        json.dumps(
            {
                "status": "failed",
                "error": "rank 1 died",
                "objective": {"metric": "val_loss", "direction": "minimize", "value": None},
            }
        )
    )
    assert _for_sweeper(ret(), ok, basic=False).return_value == 5.5
    failed = _for_sweeper(ret(), bad, basic=False)
    assert failed.status == JobStatus.FAILED
    with pytest.raises(TrialFailed, match="failed, no val_loss .rank 1 died."):
        failed.return_value  # noqa: B018 (how a sweeper reads it)
    grid = _for_sweeper(ret(), bad, basic=True)
    assert grid.status == JobStatus.COMPLETED and grid.return_value is None


# ------------------------------------------------------------------------- slow: real searches
@pytest.mark.slow
def test_optuna_search_minimizes_val_loss_and_continues_after_a_stop(tmp_path):
    """3 trials over training.lr (tiny_search's 4, cut by one: each is a training); stopped with
    SIGTERM once 1 trial completed (the second is then running), rerun with the same command: 2 more
    trials run, none of the finished ones again. "Completed" is what the study recorded: a trial's
    summary.json is written before its value reaches Optuna, and a stop in between leaves a trial
    that the resumed search rightly counts as unfinished."""
    import sqlite3
    from contextlib import closing

    import optuna

    d = tmp_path / "search"
    args = ["-m", *TINY, "experiment=tiny_search", "hydra.sweeper.n_trials=3", f"hydra.sweep.dir={d}"]
    log = tmp_path / "first.log"
    proc = start_cli(*args, log=log, cwd=tmp_path)

    def completed() -> list[Path]:
        return [p for p in d.glob("*/summary.json") if read_summary(p.parent).get("status") == "completed"]

    def recorded() -> int:
        """Trials the study holds as complete, read from its SQLite file read-only (this test must
        not write to the search's database while the search runs)."""
        if not (d / "optuna.db").is_file():
            return 0
        try:
            with closing(sqlite3.connect(f"file:{d / 'optuna.db'}?mode=ro", uri=True)) as db:
                return db.execute("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]
        except sqlite3.OperationalError:  # the search is still creating its tables, or holds a write lock
            return 0

    try:
        deadline = time.monotonic() + 400
        while recorded() < 1 and proc.poll() is None:
            assert time.monotonic() < deadline, "the first trial did not complete in time"
            time.sleep(0.2)
        assert proc.poll() is None, log.read_text()[-3000:]
        finished = {p.parent: p.stat().st_mtime_ns for p in completed()}
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        out = log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, out[-3000:]
    assert "continue the search:" in out

    r = run_cli(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "1 trial(s) finished earlier" in r.stdout and "2 of 3 to go" in r.stdout
    for run, mtime in finished.items():  # never run again
        assert (run / "summary.json").stat().st_mtime_ns == mtime
    study = optuna.load_study(study_name="tiny_search", storage=f"sqlite:///{d}/optuna.db")
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 3
    # What each trial returned to Optuna is its run's validation loss (measured, not a training loss).
    values = sorted(t.value for t in done)
    runs = [p.parent for p in completed()]
    assert len(runs) == 3
    assert values == sorted(read_summary(run)["val_loss"] for run in runs)
    for run in runs:
        s = read_summary(run)
        assert s["objective"] == {"metric": "val_loss", "direction": "minimize", "value": s["val_loss"]}
        assert s["val_loss"] == read_validation(run)[-1]["val_loss"] != s["last_loss"]
    # The end table and the report rank the trials, best first, and name the best with its rerun.
    best = min(runs, key=lambda run: read_summary(run)["val_loss"])
    assert f"rerun it: qwen3exp relaunch {best}" in r.stdout
    report = (d / "report.md").read_text()
    assert "Ranked by val_loss (minimized), best first." in report
    lines = report.splitlines()
    header = next(line.split("|") for line in lines if line.startswith("| run "))
    column = [c.strip() for c in header].index("val loss")  # found by name: columns get added
    rows = [line for line in lines if line.startswith("| ") and "completed" in line]
    assert rows and best.name in rows[0]
    vals = [float(line.split("|")[column]) for line in rows]  # in table order
    assert vals == sorted(vals) and len(set(vals)) > 1, vals


GRID_TEST = "test_a_file_grid_runs_its_real_count_and_parallel_jobs_overlap"


@pytest.fixture(scope="module", autouse=True)
def grid(request, tmp_path_factory):
    """The file grid of GRID_TEST, started with the module's first test so that it trains beside
    the others (its test collects it); not started when that test is not selected."""
    if not any(getattr(item, "originalname", item.name) == GRID_TEST for item in request.session.items):
        yield None
        return
    tmp = tmp_path_factory.mktemp("grid")
    conf = _user_conf(
        tmp,
        "grid",
        "defaults:\n  - tiny_sweep\nname: grid\nhydra:\n  mode: MULTIRUN\n"
        "  sweeper:\n    params:\n      training.lr: 1e-3,3e-3\n",
    )
    d = tmp / "sweep"
    args = ["--config-dir", str(conf), "experiment=grid", *TINY, "sweep.parallel_jobs=2"]
    # A new interpreter, as a user starts it: the jobs run in joblib's own processes, and a launcher
    # forked from the fork server would hold torch (imported there), which a real one does not.
    started = Background(*args, f"hydra.sweep.dir={d}", folder=tmp / "launcher", fresh=True)
    yield {"args": args, "dir": d, "dry_dir": tmp / "dry", "started": started}
    started.stop(d)


@pytest.mark.slow
def test_a_file_grid_runs_its_real_count_and_parallel_jobs_overlap(grid):
    """hydra.mode=MULTIRUN and hydra.sweeper.params in an experiment file, no -m: a 2-job sweep,
    run 2 at a time through hydra-joblib-launcher (sweep.parallel_jobs=2)."""
    args, d = grid["args"], grid["dir"]
    dry = run_cli(*args, f"hydra.sweep.dir={grid['dry_dir']}", "dry_run=true")  # while the sweep runs
    assert dry.returncode == 0 and _points(dry.stdout) == 2, dry.stdout[-2000:] + dry.stderr[-2000:]
    r = grid["started"].result()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "running 2 job(s), 2 at a time (hydra-joblib-launcher)" in r.stdout
    runs = sorted(p.parent for p in d.glob("*/summary.json"))
    assert len(runs) == 2 and all(read_summary(run)["status"] == "completed" for run in runs)
    assert "qwen3exp sweep finished:" in r.stdout and "2 completed" in r.stdout
    assert (d / "report.md").is_file() and "leaked" not in r.stderr
    # Side by side: each job started (experiment.yaml) before the other finished (summary.json).
    starts = [(run / "experiment.yaml").stat().st_mtime for run in runs]
    ends = [(run / "summary.json").stat().st_mtime for run in runs]
    assert max(starts) < min(ends)

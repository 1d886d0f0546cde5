"""A checked job, run: in this process (`run_point`) or in another launcher's job process
(`run_planned`), from the plan the launcher made: skip or set aside what its folder holds (sweeps),
launch torchrun, record the summary."""

from __future__ import annotations

import functools
import json
import os
import sys
import time
import traceback
from pathlib import Path

from hydra.core.hydra_config import HydraConfig

from qwen3exp.config.schema import Experiment
from qwen3exp.errors import EXIT_CONFIG_ERROR, ConfigError
from qwen3exp.launchers import sweep
from qwen3exp.launchers.local import launch
from qwen3exp.launchers.points import Point, planned_here
from qwen3exp.launchers.registry import launcher_of
from qwen3exp.run import identity, rundir
from qwen3exp.run.provenance import Origin
from qwen3exp.run.redact import redact_hydra_record

COMMAND_ENV = "QWEN3EXP_COMMAND"
"""The launcher's command line (JSON list), for provenance.json; set by the command line so that
jobs run in another process (a SLURM job) record it too."""


def run_point(point: Point, _task_cfg=None) -> dict:
    """A checked job, in this process (Hydra's run_job has made its folder and written .hydra/)."""
    return _run(point.exp, Path(HydraConfig.get().runtime.output_dir), point.plan)


def planned_task(points: list[Point]):
    """The task function another launcher's job processes run (joblib, submitit): each job's plan,
    made by this launcher, found by the job's folder; nothing is checked or planned again."""
    return functools.partial(run_planned, {str(Path(p.run_dir).resolve()): p for p in points})


def run_planned(planned: dict[str, Point], _cfg=None) -> dict:
    """A job of another launcher's process, run from the experiment this launcher checked for it
    (never validated again). A pool's job (joblib, this machine) runs the launcher's plan; a job a
    scheduler placed (SLURM) plans where it landed, since its allocation decides the platform's
    facts, the nodes and the rendezvous port (`points.planned_here`)."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    point = planned.get(str(run_dir.resolve()))
    if point is None:  # Hydra composed a job qwen3exp's launcher did not plan
        error = f"qwen3exp: no plan for the job in {run_dir}; it was not checked, so it does not run"
        print(error, file=sys.stderr, flush=True)
        return _record_failure(run_dir, None, EXIT_CONFIG_ERROR, error, 0.0)
    plan = point.plan
    if launcher_of(point.exp.launcher).hands_over:
        try:
            plan = planned_here(point, run_dir)
        except ConfigError as e:  # the allocation cannot run it (or its files changed since the check)
            print(e.render(), file=sys.stderr, flush=True)
            return _record_failure(run_dir, point.exp, EXIT_CONFIG_ERROR, e.render(), 0.0)
    return _run(point.exp, run_dir, plan)


def task(_cfg) -> dict:
    """Hydra's task function (`hydra.main`): qwen3exp's launcher runs each job from its plan
    (`run_point`, `run_planned`) and never calls it."""
    raise RuntimeError("qwen3exp runs every job through its own Hydra launcher (hydra/launcher=qwen3exp)")


def _run(exp: Experiment, run_dir: Path, plan) -> dict:
    """One job: skip or set aside what its folder holds (sweeps), launch torchrun, record the
    summary. A failure never stops a sweep; an interrupted local job stops it (SystemExit)."""
    hc = HydraConfig.get()
    single = str(hc.sweep.subdir) == "."
    if hc.output_subdir:
        redact_hydra_record(run_dir / hc.output_subdir)
    redact_hydra_record(Path(hc.sweep.dir), ("multirun.yaml",))
    if not single:
        try:
            if sweep.claim(run_dir, exp):
                return {"run_dir": str(run_dir), "status": "completed", "skipped": True}
        except ConfigError as e:  # the folder changed since the plan: leave it alone
            print(e.render(), file=sys.stderr)
            return {"run_dir": str(run_dir), "status": "failed", "exit_code": EXIT_CONFIG_ERROR}
    started = time.monotonic()
    try:
        summary = launch(plan, run_dir, origin=_origin(hc, single))
    except ConfigError as e:
        print(e.render(), file=sys.stderr)
        if single:  # the command line removes what this launch created (the claim)
            raise SystemExit(EXIT_CONFIG_ERROR) from None
        summary = _record_failure(run_dir, exp, EXIT_CONFIG_ERROR, e.render(), time.monotonic() - started)
    except Exception as e:
        if single:
            raise
        traceback.print_exc()
        summary = _record_failure(run_dir, exp, 1, f"launcher: {type(e).__name__}: {e}", time.monotonic() - started)
    launcher = launcher_of(exp.launcher)
    summary = launcher.after_job(run_dir, summary)  # SLURM's time limit: checkpoint saved, submitit requeues
    # An interrupted local run stops here (and stops a local sweep). A SLURM job returns normally
    # so that submitit records its result: the submit host reads the status from summary.json.
    if summary.get("status") == "interrupted" and not launcher.hands_over:
        raise SystemExit(summary["exit_code"])
    return {"run_dir": str(run_dir), **summary}


def _record_failure(run_dir: Path, exp: Experiment | None, code: int, error: str, wall: float) -> dict:
    """A sweep job that failed before torchrun could run still leaves a `failed` summary."""
    summary = {
        "status": "failed",
        "exit_code": code,
        "world_size": None,
        "steps_completed": 0,
        "first_loss": None,
        "last_loss": None,
        "wall_seconds": round(wall, 3),
        "error": error,
        "name": exp.name if exp else None,
        "experiment_hash": identity.of(exp) if exp else None,
    }
    rundir.atomic_write_json(run_dir / rundir.SUMMARY, summary)
    return summary


def _origin(hc, single: bool):
    command = os.environ.get(COMMAND_ENV)
    return Origin(
        command=json.loads(command) if command else [sys.executable, *sys.argv],
        mode="RUN" if single else "MULTIRUN",
        task_overrides=list(hc.overrides.task),
        hydra_overrides=list(hc.overrides.hydra),
        config_sources=[f"{s.provider}: {s.schema}://{s.path}" for s in hc.runtime.config_sources],
        config_name=hc.job.config_name,
        job_num=None if single else int(hc.job.num),
        override_dirname=hc.job.override_dirname,
        sweep_dir=None if single else str(hc.sweep.dir),
    )

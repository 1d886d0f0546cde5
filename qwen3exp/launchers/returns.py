"""What a job gives back to Hydra: its `JobReturn`, with the objective a sweeper optimises."""

from __future__ import annotations

from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, run_job
from omegaconf import OmegaConf

from qwen3exp.run import objective, rundir


class TrialFailed(RuntimeError):
    """A job that ended without an objective value (it failed, was stopped, or measured nothing), as
    the failure Hydra's sweepers expect: `JobReturn.status` FAILED, this as its value."""


def for_sweeper(ret, run_dir: Path, *, basic: bool):
    """What the sweeper gets back for a job: its objective value (`sweep.objective`, recorded in
    summary.json), read from the job's folder (so it is the same for a job run here, a SLURM job and
    a job skipped because it completed earlier).

    A job without a value: an adaptive sweeper (Optuna, ...) gets Hydra's failed-job return, so it
    records a failed trial and applies its own failure policy (Optuna: hydra.sweeper.max_failure_rate).
    Hydra's basic sweeper would end the sweep at the first failed job; a grid runs every point and
    the end table reports the failures, so there the job completes with the value None."""
    if ret.status != JobStatus.COMPLETED:  # the job raised (a launcher bug, already printed)
        return ret
    summary = rundir.read_json(run_dir / rundir.SUMMARY)
    value = objective.of_summary(summary)
    if value is not None or basic:
        ret.return_value = value
        return ret
    status = summary.get("status") if isinstance(summary, dict) else "no summary"
    error = summary.get("error") if isinstance(summary, dict) else None
    metric = (summary.get("objective") or {}).get("metric", "objective") if isinstance(summary, dict) else "objective"
    ret.status = JobStatus.FAILED
    ret.return_value = TrialFailed(f"{run_dir}: {status}, no {metric}" + (f" ({error})" if error else ""))
    return ret


def run_one(hydra_context, cfg, task):
    HydraConfig.instance().set_config(cfg)
    return run_job(
        hydra_context=hydra_context,
        task_function=task,
        config=cfg,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )


def job_return(cfg, value: dict):
    ret = JobReturn(
        overrides=list(OmegaConf.select(cfg, "hydra.overrides.task") or []),
        cfg=cfg,
        status=JobStatus.COMPLETED,
        task_name=str(OmegaConf.select(cfg, "hydra.job.name")),
    )
    ret.return_value = value
    return ret

"""A checked batch handed over to another Hydra launcher: hydra-submitit-launcher (SLURM) or
hydra-joblib-launcher (`sweep.parallel_jobs` above 1). Their job processes get each job's plan from
this launcher (`job.planned_task`): they check and plan nothing again."""

from __future__ import annotations

import functools
from typing import Any

from hydra.types import HydraContext

from qwen3exp.errors import ConfigError
from qwen3exp.launchers import sweep
from qwen3exp.launchers.job import planned_task
from qwen3exp.launchers.points import Point
from qwen3exp.launchers.protocol import Submission
from qwen3exp.launchers.returns import job_return
from qwen3exp.launchers.state import refuse


def _inner(hydra_context) -> HydraContext:
    """The context for the other launcher: Hydra's own config loader (its job processes compose
    their config as Hydra does; qwen3exp's cache of this process stays here)."""
    loader = getattr(hydra_context.config_loader, "inner", hydra_context.config_loader)
    return HydraContext(config_loader=loader, callbacks=hydra_context.callbacks)


def hand_over(launcher, config, hydra_context, points: list[Point], jobs: list, cfgs: list, at_once: int = 1) -> list:
    """The jobs that are to run go to the launcher's Hydra launcher plugin (SLURM: a job array
    through hydra-submitit-launcher; local with `sweep.parallel_jobs` above 1: a joblib pool); its
    job processes run their plans (`job.run_planned`); `at_once` of them at a time (a joblib pool)."""
    if (down := launcher.submit_problem()) is not None:
        refuse(ConfigError([down]))
    sub = Submission(
        config=config,
        hydra_context=_inner(hydra_context),
        task_function=planned_task(points),
        exp=points[0].exp,
        single=len(points) == 1 and str(config.hydra.sweep.subdir) == ".",
        jobs_at_once=at_once,
    )
    return _handed_over(functools.partial(launcher.submit, sub), points, jobs, cfgs)


def _handed_over(launch_todo, points: list[Point], jobs: list, cfgs: list) -> list:
    """The batch's returns when another Hydra launcher runs its jobs: `launch_todo(overrides,
    first_index)` gets the jobs that are to run (none: not called); a job completed earlier is
    skipped here. In the batch's order (an adaptive sweeper pairs each return with its trial)."""
    todo = [(p, j) for p, j in zip(points, jobs, strict=True) if j.state != sweep.DONE]
    returns: list[Any] = [
        job_return(cfg, {"status": "completed", "skipped": True, "run_dir": p.run_dir})
        if j.state == sweep.DONE
        else None
        for cfg, p, j in zip(cfgs, points, jobs, strict=True)
    ]
    if not todo:
        return returns
    done = iter(launch_todo([p.overrides for p, _ in todo], todo[0][1].index))
    return [r if r is not None else next(done) for r in returns]

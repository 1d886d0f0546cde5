"""Each batch of jobs Hydra's sweeper hands to qwen3exp's launcher: composed once, checked and
planned before any job of the batch starts, then run.

Every run is a one-job batch whose job folder is the run directory (`hydra.sweep.subdir=.`), so a run
(`qwen3exp.launchers.single`), a grid of the basic sweeper and the rounds of an adaptive sweeper
(Optuna) all come through `launch()`:

1. each job's config comes from Hydra's config loader, one composition per job
   (`qwen3exp.config.jobs`), and is validated against the schema and planned (`points.check_job`):
   every problem of every job is printed together and the launch exits with code 2 before any job
   starts;
2. a sweep's jobs are matched with what its directory holds (`sweep.plan`: completed earlier ->
   skipped, unfinished -> run again, another experiment -> refused) and recorded in the sweep's
   manifest, which the command line reads back for the end-of-sweep table;
3. local jobs that are to run at once (`sweep.parallel_jobs`) are checked together against this host
   (`plan.host_share`): fewer that fit run at once, or (sweep.strict_parallel_jobs) the batch is refused;
4. `dry_run=true`: the plans are printed and nothing runs;
5. each job runs here through Hydra's `run_job` with its plan (`job.run_point`), or is handed over to
   another Hydra launcher (`handover`: SLURM, a joblib pool) whose job processes run the same plans.

Each job hands its objective (`sweep.objective`, from its summary.json) back to the sweeper as
Hydra's `JobReturn.return_value` (`returns.for_sweeper`).

A point refused only because it does not fit (`DoesNotFit`: the memory per rank, the host, no
layout of parallelism=auto) stops a grid like any refusal (exit 2, every point named); an adaptive
sweeper (Optuna) chose it itself, so there it starts nothing, is named on stderr, and goes back to
the sweeper as the worst value of its objective (`refused_return`), and the search goes on.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from pathlib import Path

from hydra.core.utils import configure_log, setup_globals
from omegaconf import OmegaConf, open_dict

from qwen3exp.config.argv import BASIC_SWEEPER
from qwen3exp.config.composer import composition_problems
from qwen3exp.config.names import register_resolvers
from qwen3exp.errors import ConfigError, Problem, printable
from qwen3exp.launchers import handover, registry, sweep
from qwen3exp.launchers.job import run_point
from qwen3exp.launchers.points import HydraFiles, Point, check_job
from qwen3exp.launchers.protocol import Launcher
from qwen3exp.launchers.rerun import run_dir_problems
from qwen3exp.launchers.returns import for_sweeper, job_return, run_one
from qwen3exp.launchers.state import checked, mark_started, refuse
from qwen3exp.plan import host_share
from qwen3exp.plan.memory_fit import DoesNotFit
from qwen3exp.plan.render import print_plans
from qwen3exp.run import disk, identity, stopping
from qwen3exp.run.redact import redact_hydra_record


def launch(
    config, hydra_context, job_overrides: Sequence[Sequence[str]], initial_job_idx: int, *, prechecked=None
) -> list:
    """Check and plan every job of the batch, then run them (see the module docstring).
    `prechecked`: a single run's validation, done once by the command line (`Precheck`)."""
    sweep_dir = Path(str(config.hydra.sweep.dir))
    # Hydra's sweeper wrote multirun.yaml (the command line's overrides) before calling the launcher.
    redact_hydra_record(sweep_dir, ("multirun.yaml",))
    setup_globals()
    register_resolvers()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    single = str(OmegaConf.select(config, "hydra.sweep.subdir", default="")) == "."
    basic = OmegaConf.select(config, "hydra.sweeper._target_", default=None) in (None, BASIC_SWEEPER)
    cfgs, points, jobs, launcher, refused = checked(
        _check_batch, config, hydra_context, job_overrides, initial_job_idx, single or basic, prechecked
    )
    skipped = {i: refused_return(cfg, e) for i, (cfg, e) in refused.items()}  # said now, before any job runs
    if not points:
        return list(skipped.values())
    assert launcher is not None, "a batch with points has a launcher"
    dry = any(p.exp.dry_run for p in points)
    hosted = checked(_hosted, points, jobs, dry)
    if not single:
        print("\n".join([sweep.describe(jobs, sweep_dir), *hosted.lines]), flush=True)
        if not dry:
            sweep.record(sweep_dir, jobs)
    if dry:
        print_plans(points)
        return [
            job_return(cfg, {"status": "planned", "run_dir": p.run_dir}) for cfg, p in zip(cfgs, points, strict=True)
        ]
    if launcher.hands_over or hosted.at_once > 1:
        mark_started(points[0].exp.launcher)
        returns = handover.hand_over(launcher, config, hydra_context, points, jobs, cfgs, hosted.at_once)
    else:
        returns = [
            _run_here(hydra_context, cfg, point, job) for cfg, point, job in zip(cfgs, points, jobs, strict=True)
        ]
    ran = iter(for_sweeper(ret, Path(p.run_dir), basic=basic) for ret, p in zip(returns, points, strict=True))
    return [skipped[i] if i in skipped else next(ran) for i in range(len(job_overrides))]


def _hosted(points: list[Point], jobs: list, dry: bool) -> host_share.Share:
    """How many of the batch's jobs that are to run run at once on this host (`plan.host_share`);
    fewer than sweep.parallel_jobs with sweep.strict_parallel_jobs: refused (a dry run says so)."""
    todo = [p for p, j in zip(points, jobs, strict=True) if j.state != sweep.DONE]
    hosted = host_share.share([p.plan for p in todo], parallel_jobs(points))
    if hosted.problem is not None and not dry:
        raise ConfigError([hosted.problem])
    return hosted


def refused_return(cfg, e: DoesNotFit):
    """What an adaptive sweeper gets for a point refused because it does not fit: the worst value of
    its objective (+inf minimized, -inf maximized): the search goes on to its budget and the sampler
    is steered away from sizes that do not fit."""
    # UPSTREAM BUG: hydra-optuna-sweeper 1.2.0 (`OptunaSweeperImpl.sweep`) tells Optuna every trial
    # COMPLETE or, when reading its return value raises, FAIL: a job cannot report PRUNED, and a FAIL
    # counts against max_failure_rate (default 0: the search stops) and teaches the sampler nothing.
    # Tested by tests/test_auto_layout.py::test_an_optuna_trial_that_does_not_fit_is_refused_and_the_search_goes_on.
    _, direction = e.objective or ("objective", "minimize")
    value = float("inf") if direction == "minimize" else float("-inf")
    print(
        f"{e.render()}\nqwen3exp: not started; the sweeper gets {value} for it and goes on", file=sys.stderr, flush=True
    )
    ret = job_return(cfg, {})
    ret.return_value = value
    return ret


def _run_here(hydra_context, cfg, point: Point, job):
    # A signal between the start and the job's supervisor (Hydra's job setup), or after it (the
    # summary), waits: the supervisor takes one that came before it, and the job ends `interrupted`
    # with its summary; one after it stops the launch once the summary is written.
    with stopping.held():
        mark_started(point.exp.launcher)
        if job.state == sweep.DONE:
            print(f"qwen3exp: skipped (completed earlier, same experiment): {point.run_dir}", flush=True)
            return job_return(cfg, {"status": "completed", "skipped": True, "run_dir": point.run_dir})
        return run_one(hydra_context, cfg, functools.partial(run_point, point))


def _check_batch(
    config, hydra_context, job_overrides: Sequence[Sequence[str]], initial_job_idx: int, strict: bool, prechecked
) -> tuple[list, list[Point], list, Launcher | None, dict]:
    """Compose, check and plan every job of the batch; refuse (exit 2) with every problem of every
    job, except (`strict` false: an adaptive sweeper's batch) a job refused only because it does not
    fit. Returns (configs, points, sweep jobs, the launcher that runs them, and those refused jobs:
    {index in the batch: (config, DoesNotFit)})."""
    loader = hydra_context.config_loader
    files = HydraFiles(loader, str(config.hydra.job.config_name), list(config.hydra.overrides.hydra))
    single = str(OmegaConf.select(config, "hydra.sweep.subdir", default="")) == "."
    cfgs, points, errors, refused = [], [], [], {}
    for i, overrides in enumerate(job_overrides):
        idx = initial_job_idx + i
        label = printable(" ".join(o for o in overrides if not o.startswith("hydra.")), 300)
        context = None if single else f"sweep point {idx + 1}/{initial_job_idx + len(job_overrides)} [{label}]"
        try:
            cfg = loader.load_sweep_config(config, list(overrides))
        except Exception as e:  # Hydra's composition errors, as Problems naming the override
            stopping.check()  # a signal interrupted Hydra: what it raised while unwinding is not the config's
            errors.append(ConfigError(composition_problems(e, list(overrides), config), context=context))
            continue
        with open_dict(cfg):
            cfg.hydra.job.id = f"{idx}"
            cfg.hydra.job.num = idx
        try:
            points.append(check_job(cfg, files, list(overrides), context=context, prechecked=prechecked))
            cfgs.append(cfg)
        except DoesNotFit as e:
            if strict:
                errors.append(e)
            else:
                refused[i] = (cfg, e)
        except ConfigError as e:
            errors.append(e)
    if errors:
        refuse(ConfigError.several(errors))
    if not points:
        return cfgs, points, [], None, refused
    try:
        launcher = registry.of_batch([p.exp.launcher for p in points])
        return cfgs, points, _jobs(config, points, initial_job_idx, single), launcher, refused
    except ConfigError as e:
        refuse(e)
        raise


def _jobs(config, points: list[Point], initial_job_idx: int, single: bool) -> list:
    """The batch's jobs against what the run or sweep directory holds (refuses what it may not touch)."""
    parallel_jobs(points)
    if single:
        if problems := run_dir_problems(points[0]):
            raise ConfigError(problems)
        return [
            sweep.Job(
                initial_job_idx,
                points[0].overrides,
                Path(points[0].run_dir),
                identity.recorded_data(points[0].exp),
                sweep.NEW,
            )
        ]
    sweep_dir = Path(str(config.hydra.sweep.dir))
    jobs = sweep.plan(points, sweep_dir, first_index=initial_job_idx)
    by_dir = {Path(p.run_dir): p for p in points}
    need = sum(
        disk.estimate_bytes(by_dir[j.run_dir].exp, by_dir[j.run_dir].plan.parameters.total)
        for j in jobs
        if j.state != sweep.DONE and j.run_dir in by_dir
    )
    if (full := disk.disk_problem("hydra.sweep.dir", sweep_dir, need)) is not None:
        raise ConfigError([full])
    return jobs


def parallel_jobs(points: Sequence[Point]) -> int:
    """`sweep.parallel_jobs` of the batch (one value for every point: the batch runs through one
    joblib pool)."""
    values = {p.exp.sweep.parallel_jobs for p in points}
    if len(values) > 1:
        raise ConfigError(
            [
                Problem(
                    "sweep.parallel_jobs",
                    sorted(values),
                    "differs between sweep points",
                    "one value for the whole sweep",
                    "set it outside the swept keys",
                )
            ]
        )
    return values.pop() if values else 1

"""Each batch of jobs Hydra's sweeper hands to qwen3exp's launcher: composed by Hydra, checked and
planned before any job of the batch starts, then run.

Every run is a one-job sweep (the command line sets `hydra.sweep.subdir=.` so that the job's folder
is the run directory), so a run, a grid of the basic sweeper and the rounds of an adaptive sweeper
(Optuna) all come through `launch()`:

1. each job's config is composed by Hydra (`ConfigLoader.load_sweep_config`, what Hydra's own
   launchers do), validated against the schema and planned (`check_job`): every problem of every
   job is printed together and the launch exits with code 2 before any job starts;
2. a sweep's jobs are matched with what its directory holds (`sweep.plan`: completed earlier ->
   skipped, unfinished -> run again, another experiment -> refused) and recorded in the sweep's
   manifest, which the command line reads back for the end-of-sweep table;
3. `dry_run=true`: the plans are printed and nothing runs;
4. each job runs here through Hydra's `run_job` with the plan already made (`run_point`), or, with
   `launcher=slurm`, as a SLURM job through hydra-submitit-launcher, whose job process runs `task`.

Each job hands its objective (`sweep.objective`, from its summary.json) back to the sweeper as
Hydra's `JobReturn.return_value` (`_for_sweeper`).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwen3exp.config.schema import Experiment, SlurmLauncher
from qwen3exp.errors import EXIT_CHECK_CRASHED, EXIT_CONFIG_ERROR, ConfigError, Problem, printable
from qwen3exp.launchers import sweep
from qwen3exp.run import rundir

if TYPE_CHECKING:
    from qwen3exp.config.origins import Provenance
    from qwen3exp.plan.build import Plan

COMMAND_ENV = "QWEN3EXP_COMMAND"
"""The launcher's command line (JSON list), for provenance.json; set by the command line so that
jobs run in another process (a SLURM job) record it too."""


@dataclass
class Point:
    """One checked job."""

    overrides: list[str]
    exp: Experiment
    run_dir: str
    plan: Plan
    provenance: Provenance


# ------------------------------------------------------------------------------ where keys come from
class HydraFiles:
    """The files of a composition, read through Hydra's public ConfigLoader (for `origins`)."""

    def __init__(self, config_loader: Any, config_name: str, hydra_overrides: Sequence[str] = ()) -> None:
        self.loader = config_loader
        self.config_name = config_name
        self.searchpath = [o for o in hydra_overrides if o.split("=", 1)[0] == "hydra.searchpath"]
        """The user's config dirs (`--config-dir`, `hydra.searchpath`): part of every lookup."""
        self._defaults: dict[tuple[str, ...], list] = {}
        self._sources: dict[tuple[str, ...], dict] = {}

    def defaults_list(self, group_key: tuple[str, ...]) -> list:
        from hydra.types import RunMode

        if group_key not in self._defaults:
            self._defaults[group_key] = self.loader.compute_defaults_list(
                self.config_name, [*self.searchpath, *group_key], RunMode.RUN).defaults
        return self._defaults[group_key]

    def _source(self, config_path: str):
        for source in self.loader.get_sources():
            if source.provider not in ("hydra", "schema") and source.is_config(config_path):
                return source
        return None

    def load_file(self, config_path: str):
        source = self._source(config_path)
        return source.load_config(config_path) if source is not None else None

    def where(self, config_path: str) -> str:
        source = self._source(config_path)
        root = Path(source.path).name if source is not None and source.scheme() == "file" else "conf"
        return f"{root}/{config_path}.yaml"

    def provenance(self, overrides: list[str]) -> Provenance:
        from qwen3exp.config.compose import is_group_override, parse_overrides
        from qwen3exp.config.origins import Provenance, file_sources

        parsed = parse_overrides(overrides)
        groups = tuple(o.input_line for o in parsed if is_group_override(o))
        if groups not in self._sources:
            self._sources[groups] = file_sources(self, groups)
        return Provenance.with_overrides(self._sources[groups], [o for o in parsed if not is_group_override(o)])


# --------------------------------------------------------------------------------------- checks
def job_dir(cfg) -> str:
    """The job's folder, as Hydra's run_job computes it (sweep dir / subdir)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    HydraConfig.instance().set_config(cfg)
    subdir = str(OmegaConf.select(cfg, "hydra.sweep.subdir"))
    return str(Path(str(OmegaConf.select(cfg, "hydra.sweep.dir"))) / subdir)


def check_job(cfg, files: HydraFiles, overrides: list[str], *, context: str | None = None,
              run_dir: str | None = None) -> Point:
    """Every check of one job, all problems together, each with the file its value came from.
    `cfg`: the job's composed config (with its hydra node, unless `run_dir` is given)."""
    from qwen3exp.config.compose import experiment_data
    from qwen3exp.config.schema import check_experiment
    from qwen3exp.plan.build import make_plan, section_problems
    from qwen3exp.titan.job_config import override_claims

    try:
        data, problems = experiment_data(cfg)
    except ConfigError as e:
        raise ConfigError(e.problems, context=context) from None
    checked = check_experiment(data)
    exp = checked.exp
    problems = _merge(problems, checked.problems)
    if exp is None:
        problems = _merge(problems, section_problems(checked.sections, checked.replaced))
    provenance = files.provenance(overrides)
    run_dir = run_dir if run_dir is not None else job_dir(cfg)
    plan = None
    if not problems and exp is not None:
        try:
            plan = make_plan(exp, run_dir, overrides=overrides, provenance=provenance, claims_of=override_claims)
        except ConfigError as e:
            problems = e.problems
    if problems:
        raise ConfigError([_with_source(p, provenance) for p in problems], context=context)
    assert exp is not None and plan is not None
    return Point(list(overrides), exp, run_dir, plan, provenance)


def _merge(first: list[Problem], then: list[Problem]) -> list[Problem]:
    """`first` and the problems of `then` about other keys, or new messages about the same key
    (a value missing in the config is reported once, not again as missing by validation)."""
    from qwen3exp.errors import MISSING

    reported = {p.key for p in first}
    seen = {(p.key, p.message) for p in first}
    out = list(first)
    for p in then:
        if (p.key, p.message) in seen or (p.key in reported and p.value is MISSING):
            continue
        seen.add((p.key, p.message))
        out.append(p)
    return out


def _with_source(p: Problem, provenance) -> Problem:
    if p.source is not None or p.key.startswith("("):
        return p
    return replace(p, source=str(provenance.source(p.key)))


def rerun_problem(exp: Experiment, run_dir: Path) -> Problem | None:
    """A directory that holds a run is never overwritten. The one exception is resuming: a
    resumable checkpoint kind (dcp) and the same experiment (`qwen3exp.run.identity`) continue
    from the latest checkpoint. None: the rerun may go ahead. The message says in one sentence what
    the directory holds, and the hint gives the command that continues it (where one can) and the
    one that starts anew."""
    from qwen3exp.run import identity

    recorded = rundir.read_experiment(run_dir) is not None
    if exp.checkpoint.resumable and recorded and identity.same(exp, run_dir):
        return None
    summary = rundir.read_json(run_dir / rundir.SUMMARY)
    status = summary.get("status") if isinstance(summary, dict) else None
    held = f"a {status} run" if isinstance(status, str) and status.isidentifier() else "a run"
    anew = "start anew in a new directory: drop hydra.run.dir=... (the default adds a timestamp) or pick another"
    same = recorded and identity.same(exp, run_dir)
    if same:  # the same experiment, but it keeps no resumable checkpoint
        message = (f"holds {held} of this same experiment, which keeps no resumable checkpoint "
                   f"(checkpoint={exp.checkpoint.kind}), so there is nothing to continue; it is never overwritten")
        hint = anew
    elif not recorded:
        message = (f"holds files of {held} but no {rundir.EXPERIMENT}, so it cannot be continued; "
                   "it is never overwritten")
        hint = anew
    else:
        changed = identity.differing_keys(exp, run_dir)
        message = (f"holds {held} of a different experiment (differing keys: {', '.join(changed) or '?'}); "
                   "it is never overwritten")
        hint = (f"to continue that run with its own settings: qwen3exp relaunch {run_dir} hydra.run.dir={run_dir}; "
                f"to {anew}"
                if rundir.latest_checkpoint_step(run_dir) is not None else anew)
    return Problem("hydra.run.dir", str(run_dir), message, "a new directory, or a dcp run of this same experiment "
                   "(which continues from its latest checkpoint)", hint)


def run_dir_problems(point: Point) -> list[Problem]:
    """A run's own directory (claimed by the command line): a run in it is resumed only when it is
    the same dcp experiment (or another node's launcher of this multi-node run); room on its disk."""
    from qwen3exp.launchers.local import may_join
    from qwen3exp.run import claim

    run_dir = Path(point.run_dir)
    problems = []
    if not may_join(point.exp, run_dir) and rundir.looks_like_run(run_dir):
        if (problem := rerun_problem(point.exp, run_dir)) is not None:
            problems.append(problem)
    disk = claim.disk_problem("hydra.run.dir", run_dir, claim.estimate_bytes(point.exp, point.plan.parameters.total))
    return [*problems, *([disk] if disk is not None else [])]


def slurm_points(points: Sequence[Point]) -> bool:
    """launcher=slurm: hydra-submitit-launcher runs the jobs. It is set up once per batch, so every
    point must agree on the launcher section (a sweep over SLURM resources would silently submit
    every job with the first point's resources)."""
    launchers = [p.exp.launcher for p in points]
    slurm = [isinstance(la, SlurmLauncher) for la in launchers]
    if not any(slurm):
        return False
    if not all(slurm) or any(la != launchers[0] for la in launchers):
        raise ConfigError([Problem("launcher", "differs between sweep points",
                                   "a sweep is submitted through one Hydra launcher with one set of SLURM resources",
                                   "the same launcher section for every point",
                                   "run one sweep per launcher setting")])
    return True


def parallel_jobs(points: Sequence[Point]) -> int:
    """`sweep.parallel_jobs` of the batch (one value for every point: the batch runs through one
    joblib pool)."""
    values = {p.exp.sweep.parallel_jobs for p in points}
    if len(values) > 1:
        raise ConfigError([Problem("sweep.parallel_jobs", sorted(values), "differs between sweep points",
                                   "one value for the whole sweep", "set it outside the swept keys")])
    return values.pop() if values else 1


def _refuse(e: ConfigError) -> None:
    print(e.render(), file=sys.stderr, flush=True)
    raise SystemExit(EXIT_CONFIG_ERROR)


_started: list[bool] = [False]
"""Whether this process's launcher has started (or submitted) a job: until then, whatever stops the
launch (a refusal, a crash in a check, Ctrl-C or SIGHUP while planning) leaves nothing behind."""


def job_started() -> bool:
    return _started[0]


def _checked(check, *args, **kwargs):
    """`check(...)`; an exception other than a refusal is a bug in qwen3exp: said so, with its
    traceback (for the bug report), and exit EXIT_CHECK_CRASHED with nothing started."""
    try:
        return check(*args, **kwargs)
    except ConfigError as e:
        _refuse(e)
        raise
    except Exception as e:
        import traceback

        traceback.print_exc()
        print(f"qwen3exp: a check crashed ({type(e).__name__}: {str(e)[:300]}); this is a bug in qwen3exp, not "
              "a mistake of yours: please report it with the traceback above. Nothing was started.",
              file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CHECK_CRASHED) from None


# --------------------------------------------------------------------------------------- launch
def launch(config, hydra_context, task_function, job_overrides: Sequence[Sequence[str]],
           initial_job_idx: int) -> list:
    """Check and plan every job of the batch, then run them (see the module docstring)."""
    from hydra.core.utils import configure_log, setup_globals
    from omegaconf import OmegaConf

    from qwen3exp.config.compose import BASIC_SWEEPER, register_resolvers
    from qwen3exp.run.provenance import redact_hydra_record

    sweep_dir = Path(str(config.hydra.sweep.dir))
    # Hydra's sweeper wrote multirun.yaml (the command line's overrides) before calling the launcher.
    redact_hydra_record(sweep_dir, ("multirun.yaml",))
    setup_globals()
    register_resolvers()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    single = str(OmegaConf.select(config, "hydra.sweep.subdir", default="")) == "."
    cfgs, points, jobs, slurm = _checked(_check_batch, config, hydra_context, job_overrides, initial_job_idx, single)
    dry = any(p.exp.dry_run for p in points)
    if not single:
        print(sweep.describe(jobs, sweep_dir), flush=True)
        if not dry:
            sweep.record(sweep_dir, jobs)
    if dry:
        from qwen3exp.plan.render import print_plans

        print_plans(points)
        return [_job_return(cfg, {"status": "planned", "run_dir": p.run_dir})
                for cfg, p in zip(cfgs, points, strict=True)]
    _started[0] = True
    if slurm:
        returns = _submit(config, hydra_context, task_function, points, jobs, cfgs)
    elif (parallel := parallel_jobs(points)) > 1:
        returns = _in_parallel(config, hydra_context, task_function, points, jobs, cfgs, parallel)
    else:
        returns = []
        for cfg, point, job in zip(cfgs, points, jobs, strict=True):
            if job.state == sweep.DONE:
                print(f"qwen3exp: skipped (completed earlier, same experiment): {point.run_dir}", flush=True)
                returns.append(_job_return(cfg, {"status": "completed", "skipped": True, "run_dir": point.run_dir}))
                continue
            returns.append(_run_job(hydra_context, cfg, functools.partial(run_point, point)))
    basic = OmegaConf.select(config, "hydra.sweeper._target_", default=None) in (None, BASIC_SWEEPER)
    return [_for_sweeper(ret, Path(p.run_dir), basic=basic) for ret, p in zip(returns, points, strict=True)]


def _check_batch(config, hydra_context, job_overrides: Sequence[Sequence[str]], initial_job_idx: int,
                 single: bool) -> tuple[list, list[Point], list, bool]:
    """Compose, check and plan every job of the batch; refuse (exit 2) with every problem of every
    job. Returns (configs, points, sweep jobs, whether SLURM runs them)."""
    from omegaconf import open_dict

    from qwen3exp.config.compose import composition_problems
    from qwen3exp.run import identity

    loader = hydra_context.config_loader
    files = HydraFiles(loader, str(config.hydra.job.config_name), list(config.hydra.overrides.hydra))
    sweep_dir = Path(str(config.hydra.sweep.dir))
    cfgs, points, errors = [], [], []
    for i, overrides in enumerate(job_overrides):
        idx = initial_job_idx + i
        label = printable(" ".join(o for o in overrides if not o.startswith("hydra.")), 300)
        context = None if single else f"sweep point {idx + 1}/{initial_job_idx + len(job_overrides)} [{label}]"
        try:
            cfg = loader.load_sweep_config(config, list(overrides))
        except Exception as e:  # Hydra's composition errors, as Problems naming the override
            errors.append(ConfigError(composition_problems(e, list(overrides), config), context=context))
            continue
        with open_dict(cfg):
            cfg.hydra.job.id = f"{idx}"
            cfg.hydra.job.num = idx
        try:
            points.append(check_job(cfg, files, list(overrides), context=context))
            cfgs.append(cfg)
        except ConfigError as e:
            errors.append(e)
    if errors:
        _refuse(ConfigError.several(errors))
    try:
        slurm = slurm_points(points)
        parallel_jobs(points)
        if single:
            jobs = [sweep.Job(initial_job_idx, points[0].overrides, Path(points[0].run_dir),
                              identity.recorded_data(points[0].exp), sweep.NEW)]
            if problems := run_dir_problems(points[0]):
                raise ConfigError(problems)
        else:
            jobs = sweep.plan(points, sweep_dir, first_index=initial_job_idx)
            _sweep_disk(jobs, points, sweep_dir)
    except ConfigError as e:
        _refuse(e)
    return cfgs, points, jobs, slurm


class TrialFailed(RuntimeError):
    """A job that ended without an objective value (it failed, was stopped, or measured nothing), as
    the failure Hydra's sweepers expect: `JobReturn.status` FAILED, this as its value."""


def _for_sweeper(ret, run_dir: Path, *, basic: bool):
    """What the sweeper gets back for a job: its objective value (`sweep.objective`, recorded in
    summary.json), read from the job's folder (so it is the same for a job run here, a SLURM job and
    a job skipped because it completed earlier).

    A job without a value: an adaptive sweeper (Optuna, ...) gets Hydra's failed-job return, so it
    records a failed trial and applies its own failure policy (Optuna: hydra.sweeper.max_failure_rate).
    Hydra's basic sweeper would end the sweep at the first failed job; a grid runs every point and
    the end table reports the failures, so there the job completes with the value None."""
    from hydra.core.utils import JobStatus

    from qwen3exp.run import objective

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


def _sweep_disk(jobs: list, points: list[Point], sweep_dir: Path) -> None:
    from qwen3exp.run import claim

    by_dir = {Path(p.run_dir): p for p in points}
    need = sum(claim.estimate_bytes(by_dir[j.run_dir].exp, by_dir[j.run_dir].plan.parameters.total)
               for j in jobs if j.state != sweep.DONE and j.run_dir in by_dir)
    if (disk := claim.disk_problem("hydra.sweep.dir", sweep_dir, need)) is not None:
        raise ConfigError([disk])


def _run_job(hydra_context, cfg, task):
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import run_job

    HydraConfig.instance().set_config(cfg)
    return run_job(hydra_context=hydra_context, task_function=task, config=cfg,
                   job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")


def _job_return(cfg, value: dict):
    from hydra.core.utils import JobReturn, JobStatus
    from omegaconf import OmegaConf

    ret = JobReturn(overrides=list(OmegaConf.select(cfg, "hydra.overrides.task") or []), cfg=cfg,
                    status=JobStatus.COMPLETED, task_name=str(OmegaConf.select(cfg, "hydra.job.name")))
    ret.return_value = value
    return ret


def _submit(config, hydra_context, task_function, points: list[Point], jobs: list, cfgs: list) -> list:
    """launcher=slurm: the jobs that are to run go to hydra-submitit-launcher (a job array), set up
    from the validated launcher section; its job processes run `task`."""
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as Submitit

    from qwen3exp.launchers import slurm

    if (down := slurm.controller_problem()) is not None:
        _refuse(ConfigError([down]))
    sweep_dir = Path(str(config.hydra.sweep.dir))

    def submit(overrides: list, first: int) -> list:
        print(f"qwen3exp: submitting {len(overrides)} SLURM job(s) through hydra-submitit-launcher; "
              f"{'run' if len(points) == 1 and str(config.hydra.sweep.subdir) == '.' else 'sweep'} directory "
              f"{sweep_dir}", flush=True)
        inner = Submitit(**slurm.submitit_params(points[0].exp, sweep_dir))
        inner.setup(hydra_context=hydra_context, task_function=task_function, config=config)
        with slurm.results_or_give_up(sweep_dir):
            return list(inner.launch(overrides, initial_job_idx=first))

    return _handed_over(submit, points, jobs, cfgs)


def _handed_over(launch_todo, points: list[Point], jobs: list, cfgs: list) -> list:
    """The batch's returns when another Hydra launcher runs its jobs: `launch_todo(overrides,
    first_index)` gets the jobs that are to run (none: not called); a job completed earlier is
    skipped here. In the batch's order (an adaptive sweeper pairs each return with its trial)."""
    todo = [(p, j) for p, j in zip(points, jobs, strict=True) if j.state != sweep.DONE]
    returns: list[Any] = [_job_return(cfg, {"status": "completed", "skipped": True, "run_dir": p.run_dir})
                          if j.state == sweep.DONE else None for cfg, p, j in zip(cfgs, points, jobs, strict=True)]
    if not todo:
        return returns
    done = iter(launch_todo([p.overrides for p, _ in todo], todo[0][1].index))
    return [r if r is not None else next(done) for r in returns]


def _in_parallel(config, hydra_context, task_function, points: list[Point], jobs: list, cfgs: list,
                 n_jobs: int) -> list:
    """sweep.parallel_jobs > 1: the checked jobs that are to run go to hydra-joblib-launcher's
    JoblibLauncher (a pool of `n_jobs` processes); each job process runs `task`, which checks and
    plans the job again and runs it like a local one."""
    from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher

    def run_pool(overrides: list, first: int) -> list:
        print(f"qwen3exp: running {len(overrides)} job(s), {n_jobs} at a time (hydra-joblib-launcher)", flush=True)
        # max_nbytes=None: nothing is memory-mapped (a job gets a few override strings), so joblib
        # makes no temporary folder in /dev/shm that would be left for its resource tracker at exit.
        inner = JoblibLauncher(n_jobs=n_jobs, prefer="processes", max_nbytes=None)
        inner.setup(hydra_context=hydra_context, task_function=task_function, config=config)
        try:
            return list(inner.launch(overrides, initial_job_idx=first))
        finally:
            # joblib keeps its worker processes for reuse (loky's idle timeout is 300 s): they would
            # outlive the sweep, holding its terminal and pipes. Nothing reuses them: stop them now.
            from joblib.externals.loky import get_reusable_executor

            get_reusable_executor().shutdown(wait=True)

    return _handed_over(run_pool, points, jobs, cfgs)


# ------------------------------------------------------------------------------------ in the job
def run_point(point: Point, _task_cfg=None) -> dict:
    """A checked job, in this process (Hydra's run_job has made its folder and written .hydra/)."""
    from hydra.core.hydra_config import HydraConfig

    return _run(point.exp, Path(HydraConfig.get().runtime.output_dir), point.plan)


def task(cfg) -> dict:
    """Hydra's task function: a job run by another launcher process (a SLURM job) checks and plans
    itself, then runs like `run_point`."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from qwen3exp.config.compose import register_resolvers

    register_resolvers()
    hc = HydraConfig.get()
    files = HydraFiles(GlobalHydra.instance().config_loader(), str(hc.job.config_name), list(hc.overrides.hydra))
    overrides = list(hc.overrides.task)
    run_dir = Path(hc.runtime.output_dir)
    try:
        point = check_job(cfg, files, overrides, run_dir=str(run_dir))
    except ConfigError as e:  # the config changed since it was checked on the submit host
        print(e.render(), file=sys.stderr, flush=True)
        return _record_failure(run_dir, None, EXIT_CONFIG_ERROR, e.render(), 0.0)
    return _run(point.exp, Path(hc.runtime.output_dir), point.plan)


def _run(exp: Experiment, run_dir: Path, plan) -> dict:
    """One job: skip or set aside what its folder holds (sweeps), launch torchrun, record the
    summary. A failure never stops a sweep; an interrupted local job stops it (SystemExit)."""
    from hydra.core.hydra_config import HydraConfig

    from qwen3exp.launchers.local import launch
    from qwen3exp.run.provenance import redact_hydra_record

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
        import traceback

        traceback.print_exc()
        summary = _record_failure(run_dir, exp, 1, f"launcher: {type(e).__name__}: {e}", time.monotonic() - started)
    if summary.get("status") == "requeued":  # SLURM's time limit: checkpoint saved, submitit requeues
        from qwen3exp.launchers import slurm

        summary = slurm.requeue_this_job(run_dir, summary)
    # An interrupted local run stops here (and stops a local sweep). A SLURM job returns normally
    # so that submitit records its result: the submit host reads the status from summary.json.
    if summary.get("status") == "interrupted" and not isinstance(exp.launcher, SlurmLauncher):
        raise SystemExit(summary["exit_code"])
    return {"run_dir": str(run_dir), **summary}


def _record_failure(run_dir: Path, exp: Experiment | None, code: int, error: str, wall: float) -> dict:
    """A sweep job that failed before torchrun could run still leaves a `failed` summary."""
    from qwen3exp.run import identity

    summary = {"status": "failed", "exit_code": code, "world_size": None, "steps_completed": 0,
               "first_loss": None, "last_loss": None, "wall_seconds": round(wall, 3), "error": error,
               "name": exp.name if exp else None,
               "experiment_hash": identity.of(exp) if exp else None}
    rundir.atomic_write_json(run_dir / rundir.SUMMARY, summary)
    return summary


def _origin(hc, single: bool):
    from qwen3exp.run.provenance import Origin

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

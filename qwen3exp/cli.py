"""The command line: `python -m qwen3exp [overrides]` (`-m` for a sweep, `dry_run=true` to plan).

1. Every point (one, or each point of a sweep) is composed, validated and planned before anything
   starts; any mistake prints the key, the value and what is allowed, and exits with code 2.
2. A sweep is planned against its directory (`qwen3exp.launchers.sweep`): jobs that completed earlier with
   the same resolved experiment are skipped, a folder that holds a different experiment refuses
   the sweep (exit 2).
3. Then Hydra runs (or sweeps) for real with the run/sweep directory pinned to what was checked,
   and each job launches torchrun through `qwen3exp.launchers.local`. A failing sweep job is recorded
   `failed` and the sweep goes on; at the end a summary table is printed and the report files are
   written into the sweep directory. Exit code: 0 all completed, 1 a job failed or did not run,
   130/143 stopped by Ctrl-C/SIGTERM.
4. With `launcher=slurm` Hydra's submitit launcher runs the same jobs as SLURM jobs (a run is a
   one-job sweep whose job directory is the run directory); the outcome is read back from the
   jobs' summaries, and Ctrl-C while waiting cancels the jobs (`qwen3exp.launchers.slurm`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from qwen3exp.run import rundir

from qwen3exp.launchers import sweep
from qwen3exp.config.compose import Composer, Invocation, parse_argv, shown, sweep_points
from qwen3exp.errors import EXIT_CONFIG_ERROR, ConfigError, Problem
from qwen3exp.config.schema import Experiment, SlurmLauncher

if TYPE_CHECKING:
    from qwen3exp.plan.build import Plan
    from qwen3exp.run.provenance import Provenance

_results: list[dict] = []
_points: dict[tuple[str, ...], Point] = {}
COMMAND_ENV = "QWEN3EXP_COMMAND"
"""The launcher's command line (JSON list), for provenance.json; set by main() so that jobs run by
a launcher plugin in another process record it too."""


@dataclass
class Point:
    """One checked point of a run or sweep."""

    overrides: list[str]
    exp: Experiment
    run_dir: str
    sweep_dir: str
    plan: Plan
    provenance: Provenance

    @property
    def task_key(self) -> tuple[str, ...]:
        return _task_key(self.overrides)


def _task_key(overrides) -> tuple[str, ...]:
    """The overrides Hydra records as the job's task overrides (hydra's own excluded)."""
    return tuple(o for o in overrides if not o.lstrip("+~").startswith("hydra"))


def preflight(inv: Invocation) -> list[Point]:
    """Compose, validate and plan every point; raise one ConfigError naming every problem of every
    point. Composition is shared between points (see `Composer`), so a 100-point sweep over values
    checks in about a second."""
    points = sweep_points(inv.overrides) if inv.multirun else [inv.overrides]
    out, errors, pinned = [], [], []
    with Composer(inv.config_dir, inv.config_name, inv.search_dirs) as composer:
        for i, point in enumerate(points):
            context = f"sweep point {i + 1}/{len(points)} [{' '.join(shown(o) for o in point if not o.startswith('hydra.'))}]" \
                if inv.multirun else None
            try:
                checked = check_point(composer, [*point, *pinned], context=context,
                                      job_num=i if inv.multirun else None)
            except ConfigError as e:
                if e.context is None:
                    e.context = context
                errors.append(e)
                continue
            if inv.multirun:
                if not pinned:  # every point uses the first point's sweep dir (one ${now})
                    inv.output_dir = checked.sweep_dir
                    pinned = [f"hydra.sweep.dir={sweep.quote_value(checked.sweep_dir)}"]
            else:
                inv.output_dir = checked.run_dir
            out.append(replace(checked, overrides=point))
    if errors:
        raise ConfigError.several(errors)
    return out


def rerun_problem(exp: Experiment, run_dir: Path) -> Problem | None:
    """A directory that holds a run is never overwritten. The one exception is resuming: with
    checkpoint=dcp and the identical resolved experiment (same experiment.yaml content hash) the
    run continues from its latest checkpoint. None: the rerun may go ahead."""
    from qwen3exp.launchers.local import run_experiment

    new = rundir.experiment_yaml(run_experiment(exp).model_dump(mode="json"))
    try:
        old = (run_dir / rundir.EXPERIMENT).read_text()
    except OSError:
        old = None
    if exp.checkpoint.kind == "dcp" and old is not None and rundir.sha256(old) == rundir.sha256(new):
        return None
    if exp.checkpoint.kind != "dcp":
        message = "already holds a run; it is never overwritten (only checkpoint=dcp reruns resume)"
    elif old is None:
        message = f"already holds files of a run but no {rundir.EXPERIMENT}; cannot resume"
    else:
        changed = _changed_keys(old, new)
        message = (f"holds a run of a different experiment (experiment.yaml sha256 {rundir.sha256(old)[:12]}, "
                   f"this one {rundir.sha256(new)[:12]}; differing keys: {', '.join(changed) or '?'}); "
                   "a dcp rerun resumes only the identical experiment")
    return Problem("hydra.run.dir", str(run_dir), message, "a new directory (the default adds a timestamp)",
                   "choose another name=... or hydra.run.dir=..., or rerun with exactly the same settings")


def _changed_keys(old: str, new: str) -> list[str]:
    import yaml

    from qwen3exp.analysis.diff import differences

    try:
        a, b = yaml.safe_load(old), yaml.safe_load(new)
    except yaml.YAMLError:
        return []
    return [key for key, _, _ in differences(a or {}, b or {})]


def check_point(composer: Composer, overrides: list[str], *, context: str | None = None,
                job_num: int | None = None) -> Point:
    """Every check of one point, all problems together, each with the file its value came from."""
    from qwen3exp.plan.build import make_plan, section_problems
    from qwen3exp.config.schema import check_experiment

    composed = composer.compose(overrides, context=context, job_num=job_num, collect=True)
    checked = check_experiment(composed.data)
    exp = checked.exp
    problems = _merge(composed.problems, checked.problems)
    if exp is None:
        problems = _merge(problems, section_problems(checked.sections, checked.replaced))
    provenance = composer.provenance(composed)
    plan = None
    if not problems:
        try:
            plan = make_plan(exp, composed.run_dir, overrides=overrides, provenance=provenance)
        except ConfigError as e:
            problems = e.problems
    if problems:
        raise ConfigError([_with_source(p, provenance) for p in problems], context=context)
    return Point(overrides, exp, composed.run_dir, composed.sweep_dir, plan, provenance)


def _merge(first: list[Problem], then: list[Problem]) -> list[Problem]:
    """`first` and the problems of `then` about other keys, or new messages about the same key
    (a value missing in the config is reported once, not again as missing by validation)."""
    reported = {p.key for p in first}
    seen = {(p.key, p.message) for p in first}
    out = list(first)
    for p in then:
        if (p.key, p.message) in seen or (p.key in reported and p.value is _missing()):
            continue
        seen.add((p.key, p.message))
        out.append(p)
    return out


def _missing():
    from qwen3exp.errors import MISSING

    return MISSING


def _with_source(p: Problem, provenance) -> Problem:
    if p.source is not None or p.key.startswith("("):
        return p
    return replace(p, source=str(provenance.source(p.key)))


def _task(cfg) -> None:
    """One Hydra job: validate (cheap, already checked), launch torchrun, record the summary.
    In a sweep, a job that completed earlier is skipped and a failure never stops the sweep."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from qwen3exp.launchers.local import launch, prepare
    from qwen3exp.plan.build import make_plan
    from qwen3exp.config.schema import validate_experiment

    hc = HydraConfig.get()
    multirun = hc.mode.name == "MULTIRUN"
    data = OmegaConf.to_container(cfg, resolve=True)
    data.pop("hydra", None)
    run_dir = Path(hc.runtime.output_dir)
    from qwen3exp.run.provenance import redact_hydra_record

    if hc.output_subdir:
        redact_hydra_record(run_dir / hc.output_subdir)
    if multirun:
        redact_hydra_record(Path(hc.sweep.dir), ("multirun.yaml",))
    exp = validate_experiment(data)
    if multirun:
        try:
            if sweep.claim(run_dir, exp.model_dump(mode="json")):
                _results.append({"run_dir": str(run_dir), "status": "completed", "skipped": True})
                return
        except ConfigError as e:  # the folder changed since the plan: leave it alone
            print(e.render(), file=sys.stderr)
            _results.append({"run_dir": str(run_dir), "status": "failed", "exit_code": EXIT_CONFIG_ERROR})
            return
    checked = _points.get(_task_key(hc.overrides.task))
    started = time.monotonic()
    try:
        plan = make_plan(exp, run_dir, overrides=list(hc.overrides.task),
                         provenance=checked.provenance if checked is not None else None)
        summary = launch(prepare(exp), run_dir, plan, origin=_origin(hc, multirun))
    except ConfigError as e:
        print(e.render(), file=sys.stderr)
        if not multirun:  # the launcher removes what this launch created (`main`, the claim)
            raise SystemExit(EXIT_CONFIG_ERROR)
        summary = _record_failure(run_dir, exp, EXIT_CONFIG_ERROR, e.render(), time.monotonic() - started)
    except Exception as e:
        if not multirun:
            raise
        import traceback

        traceback.print_exc()
        summary = _record_failure(run_dir, exp, 1, f"launcher: {type(e).__name__}: {e}", time.monotonic() - started)
    _results.append({"run_dir": str(run_dir), **summary})
    # An interrupted local run stops here (and stops a local sweep). A SLURM job returns normally
    # so that submitit records its result: the submit host reads the status from summary.json.
    if summary.get("status") == "interrupted" and not isinstance(exp.launcher, SlurmLauncher):
        raise SystemExit(summary["exit_code"])


def _record_failure(run_dir: Path, exp: Experiment, code: int, error: str, wall: float) -> dict:
    """A sweep job that failed before torchrun could run still leaves a `failed` summary."""
    summary = {"status": "failed", "exit_code": code, "world_size": None, "steps_completed": 0,
               "first_loss": None, "last_loss": None, "wall_seconds": round(wall, 3), "error": error,
               "name": exp.name, "experiment_hash": rundir.experiment_hash(exp.model_dump(mode="json"))}
    rundir.atomic_write_json(run_dir / rundir.SUMMARY, summary)
    return summary


def _origin(hc, multirun: bool):
    from qwen3exp.run.provenance import Origin

    command = os.environ.get(COMMAND_ENV)
    return Origin(
        command=json.loads(command) if command else [sys.executable, *sys.argv],
        mode=hc.mode.name,
        task_overrides=list(hc.overrides.task),
        hydra_overrides=list(hc.overrides.hydra),
        config_sources=[f"{s.provider}: {s.schema}://{s.path}" for s in hc.runtime.config_sources],
        config_name=hc.job.config_name,
        job_num=int(hc.job.num) if multirun else None,
        override_dirname=hc.job.override_dirname,
        sweep_dir=str(hc.sweep.dir) if multirun else None,
    )


def _run_hydra(inv: Invocation, extra: list[str]) -> None:
    import hydra

    main = hydra.main(config_path=str(inv.config_dir), config_name=inv.config_name, version_base="1.3")(_task)
    saved = sys.argv
    sys.argv = [saved[0], *inv.hydra_argv(extra)]
    try:
        main()
    finally:
        sys.argv = saved


def main(argv: list[str] | None = None, *, command: list[str] | None = None) -> int:
    """`command`: the command line to record (default: `python -m qwen3exp ARGV`)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["init"]:
        from qwen3exp import scaffold
        return scaffold.main(argv[1:])
    command = command or [sys.executable, "-m", "qwen3exp", *argv]
    os.environ[COMMAND_ENV] = json.dumps(command)
    try:
        inv = parse_argv(argv)
    except ConfigError as e:
        print(e.render(), file=sys.stderr)
        return EXIT_CONFIG_ERROR
    if inv.info_flags:  # --help, --cfg job, ...: Hydra answers by itself
        _run_hydra(inv, [])
        return 0
    try:
        points = preflight(inv)
        slurm = _slurm_points(points)
        jobs = sweep.plan(points, Path(inv.output_dir)) if inv.multirun else None
    except ConfigError as e:
        print(e.render(), file=sys.stderr)
        return EXIT_CONFIG_ERROR
    if jobs is not None:
        print(sweep.describe(jobs, Path(inv.output_dir)), flush=True)
    if any(p.exp.dry_run for p in points):
        from qwen3exp.plan.render import print_plans

        return print_plans(points)
    _points.clear()
    _points.update({p.task_key: p for p in points})
    try:  # nothing is written before the directory is ours
        if slurm:
            from qwen3exp.launchers.slurm import controller_problem

            if (down := controller_problem()) is not None:
                raise ConfigError([down])
        held = _claim_sweep(jobs, Path(inv.output_dir), points) if inv.multirun else _claim_run(points[0])
    except ConfigError as e:
        print(e.render(), file=sys.stderr)
        return EXIT_CONFIG_ERROR
    discard = False
    try:
        if inv.multirun:
            return _multirun(inv, jobs, command, slurm=slurm)
        run_dir = Path(points[0].run_dir)
        if slurm:
            return _submit_run(inv, run_dir)
        _results.clear()
        try:
            _run_hydra(inv, [f"hydra.run.dir={sweep.quote_value(str(run_dir))}"])
        except SystemExit as e:  # refused inside the job, before any worker started
            discard = e.code == EXIT_CONFIG_ERROR
            raise
        if not _results:
            return 1
        return int(_results[0]["exit_code"])
    finally:
        held.release(discard=discard)


def _claim_run(point: Point):
    """Claim the run directory (or refuse it): new, empty, a resumable run of this experiment, or
    another node's launcher's folder of the same multi-node run; room on its disk."""
    from qwen3exp.run import claim
    from qwen3exp.plan import placement
    run_dir = Path(point.run_dir)
    exp = point.exp
    disk = claim.disk_problem("hydra.run.dir", run_dir, claim.estimate_bytes(exp, point.plan.parameters.total))
    if disk is not None:
        raise ConfigError([disk])
    node = placement.resolve(exp, os.environ).node_rank if exp.launcher.nnodes > 1 else None
    held = claim.claim(run_dir, key="hydra.run.dir", lock=claim.lock_name(node))
    try:
        if not _joins(exp, run_dir):
            problem = claim.not_a_run_problem(held)
            if problem is None and rundir.looks_like_run(run_dir):
                problem = rerun_problem(exp, run_dir)
            if problem is not None:
                raise ConfigError([problem])
    except ConfigError:
        held.release(discard=True)
        raise
    return held


def _claim_sweep(jobs: list, sweep_dir: Path, points: list[Point]):
    """Claim the sweep directory: new, empty, or an earlier sweep's (resume); room for the jobs
    that will run. (Each job's folder is inside it; the plan already checked them.)"""
    from qwen3exp.run import claim
    by_dir = {Path(p.run_dir): p for p in points}
    need = sum(claim.estimate_bytes(by_dir[j.run_dir].exp, by_dir[j.run_dir].plan.parameters.total)
               for j in jobs if j.state != sweep.DONE and j.run_dir in by_dir)
    disk = claim.disk_problem("hydra.sweep.dir", sweep_dir, need)
    if disk is not None:
        raise ConfigError([disk])
    held = claim.claim(sweep_dir, key="hydra.sweep.dir")
    if (problem := claim.not_a_sweep_problem(held)) is not None:
        held.release(discard=True)
        raise ConfigError([problem])
    return held


class _Terminated(BaseException):
    """SIGTERM between two jobs (a scheduler's preemption): stop like Ctrl-C, with the summary."""


def _on_sigterm(_signum, _frame):
    raise _Terminated()


def _joins(exp: Experiment, run_dir: Path) -> bool:
    from qwen3exp.launchers.local import may_join

    return may_join(exp, run_dir)


def _slurm_points(points) -> bool:
    """launcher=slurm: Hydra's submitit launcher runs the jobs. It is set up once per sweep, so
    every point must agree on the launcher section (a sweep over SLURM resources would silently
    submit every job with the first point's resources)."""
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


def _submit_run(inv: Invocation, run_dir: Path) -> int:
    """launcher=slurm, one run: a one-job sweep whose job directory is the run directory. The
    outcome is the job's summary.json; Ctrl-C while waiting cancels the job."""
    from qwen3exp.launchers import slurm
    print(f"qwen3exp: submitting a SLURM job through hydra-submitit-launcher; run directory {run_dir}", flush=True)
    started = time.time()
    stopped = None
    try:
        _run_hydra(replace(inv, multirun=True), [*slurm.hydra_overrides(),
                                                 f"hydra.sweep.dir={sweep.quote_value(str(run_dir))}",
                                                 "hydra.sweep.subdir=."])
    except KeyboardInterrupt:
        stopped = 130
    except SystemExit as e:  # Hydra gave up on a failed job; its summary tells what happened
        print(f"qwen3exp: hydra-submitit-launcher exited with {e.code}", file=sys.stderr)
    if stopped:
        _cancel(run_dir)
    summary = rundir.read_json(run_dir / rundir.SUMMARY)
    if not isinstance(summary, dict) or (run_dir / rundir.SUMMARY).stat().st_mtime < started - 1:
        print(f"qwen3exp: the SLURM job wrote no summary (job logs: {run_dir / '.submitit'})", file=sys.stderr)
        return stopped or 1
    error = summary.get("error")
    print(f"qwen3exp: {summary.get('status')}: {run_dir}" + (f"\n  error: {error}" if error else ""), flush=True)
    return stopped or int(summary.get("exit_code", 1))


def _cancel(sweep_dir: Path) -> None:
    """Ctrl-C or SIGTERM while waiting for SLURM jobs: cancel them and wait until they have ended
    (their launchers record the runs as interrupted)."""
    from qwen3exp.launchers import slurm
    jobs = slurm.cancel_submitted(sweep_dir)
    print(f"qwen3exp: cancelled SLURM job(s) {', '.join(jobs) or '(none found)'}", file=sys.stderr, flush=True)
    slurm.wait_gone(jobs, timeout_s=60)


def _multirun(inv: Invocation, jobs: list, command: list[str], *, slurm: bool = False) -> int:
    """Run the sweep through Hydra (launcher=slurm: as a SLURM job array); whatever happens, end
    with the summary table."""
    sweep_dir = Path(inv.output_dir)
    print(f"  to resume this sweep later, run: {sweep.resume_command(command, sweep_dir)}", flush=True)
    _results.clear()
    stopped = None
    extra = [f"hydra.sweep.dir={sweep.quote_value(str(sweep_dir))}"]
    if slurm:
        from qwen3exp.launchers import slurm as slurm_
        extra = [*slurm_.hydra_overrides(), *extra]
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        _run_hydra(inv, extra)
    except KeyboardInterrupt:  # Ctrl-C between two jobs (launcher=slurm: while waiting for them)
        stopped = 130
    except _Terminated:
        stopped = 143
    except SystemExit as e:  # a job stopped by a signal, or Hydra itself gave up
        if e.code in (130, 143):
            stopped = e.code
        else:
            print(f"qwen3exp: the sweep stopped early (exit {e.code})", file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, old)
    if slurm and stopped:
        _cancel(sweep_dir)
    return sweep.finish(jobs, sweep_dir, command, stopped=stopped)


def entry() -> None:
    """`python -m qwen3exp` and the `qwen3exp` script: main(), then a prompt exit. Everything a run
    writes is already on disk (atomic, fsynced), and the interpreter's own teardown of torch and
    torchtitan (imported to build the config) took 5-11 s on a loaded 2-core machine: long enough
    to turn a Ctrl-C that stopped every rank in 2 s into a launcher that lingers."""
    import logging

    try:
        code = main()
    except SystemExit as e:  # Hydra jobs end with SystemExit (interrupted runs: 130 / 143)
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        code = 130
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()

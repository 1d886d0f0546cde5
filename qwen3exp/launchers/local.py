"""The local launcher (`launcher=local`): each job runs in this process, the jobs of a batch one
after the other (or in a joblib pool with `sweep.parallel_jobs` above 1); and the launch of one
node's ranks, which a SLURM job runs too, on its first node (`launch`).

`launch(plan, run_dir)` runs a Plan (`qwen3exp.plan.build.make_plan`: every check that can fail on
a bad configuration, and everything resolved: platform, mesh, batches, node placement, override
claims, this node's torchrun command) and resolves nothing again. It writes the run directory (with
`provenance.json`: where the run came from), starts torchrun (or srun starting one torchrun agent
per node) at once and supervises it (`qwen3exp.launchers.torchrun`):
- torchtitan's own config checks run in the ranks, before the trainer is built (the launcher does
  not import torch or torchtitan for a plain experiment: the ranks import them anyway). A rank they
  refuse records a ConfigError (`qwen3exp.titan.job_config.write_refusal`); the launcher stops
  torchrun at once and raises that ConfigError (exit 2, before any training step).
- Ctrl-C or SIGTERM: the ranks are stopped; summary `interrupted`, exit code 130 / 143; one line
  says what is saved and the command that resumes (`qwen3exp.launchers.outcome`).
- A rank that raises: torchrun stops the others at once; the summary carries that rank's own error
  (`logs/error_rank<R>.json`, written by the worker), not torchrun's wrapper text.
- `summary.json` (node 0; with the experiment's content hash) is written atomically, also when the
  disk fills (`qwen3exp.launchers.outcome`); its wall time is the command's, an HF export and its
  verification included; after a SIGKILLed launcher there is none, and a relaunch in the same
  directory resumes from the latest complete checkpoint when checkpointing is on.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

from qwen3exp.config.schema import Experiment
from qwen3exp.errors import ConfigError, Problem
from qwen3exp.launchers import outcome
from qwen3exp.launchers.outcome import experiment_hash, node_file
from qwen3exp.launchers.protocol import Submission, may_join
from qwen3exp.launchers.torchrun import Interrupted, StopSignals, rank_env, run_torchrun
from qwen3exp.plan import placement, render, tracking
from qwen3exp.plan.build import Plan, Prepared, prepare as _prepare
from qwen3exp.run import console, identity, procs, progress, provenance, redact, rundir, timelimit
from qwen3exp.titan import job_config


def write_run_files(plan: Plan, run_dir: Path) -> None:
    """What the ranks read (experiment.yaml, platform.json) and the record of the launch (plan.json,
    command.txt). torchtitan_config.json is written by rank 0: the config it trains with."""
    run_dir.mkdir(parents=True, exist_ok=True)
    rundir.atomic_write_json(run_dir / node_file(rundir.PLAN, plan.placement), plan.as_json())
    rundir.atomic_write_text(run_dir / rundir.EXPERIMENT, rundir.experiment_yaml(identity.recorded_data(plan.exp)))
    rundir.atomic_write_json(run_dir / rundir.PLATFORM, asdict(plan.platform))
    rundir.atomic_write_text(
        run_dir / node_file(rundir.COMMAND, plan.placement), shlex.join(redact.redact_argv(plan.command)) + "\n"
    )


def _wait_until_free(run_dir: Path, timeout_s: float) -> None:
    """A relaunch must not train next to a previous launch's ranks (they may still be dying after
    their launcher was SIGKILLed): wait for them, then refuse."""
    deadline = time.monotonic() + timeout_s
    said = False
    while busy := procs.workers_of(run_dir):
        if not said:
            console.logger("qwen3exp.launch").info(
                f"qwen3exp: waiting up to {timeout_s:.0f}s for the previous launch's rank(s) "
                f"{', '.join(map(str, busy))} in {run_dir} to end"
            )
            said = True
        if time.monotonic() > deadline:
            raise ConfigError(
                [
                    Problem(
                        "hydra.run.dir",
                        str(run_dir),
                        f"is in use by running process(es) {', '.join(map(str, busy))}",
                        "a directory no live run uses",
                        "stop that run first",
                    )
                ]
            )
        time.sleep(0.2)


def _reset_metrics(exp: Experiment, run_dir: Path) -> int | None:
    """Node 0, before any rank starts: a fresh run starts an empty metrics.jsonl; a run resuming
    from a checkpoint keeps the rows up to that step (the later ones are trained again).
    Returns the step resumed from."""
    step = rundir.latest_checkpoint_step(run_dir) if exp.checkpoint.kind == "dcp" else None
    if step is None:
        (run_dir / rundir.METRICS).unlink(missing_ok=True)
    else:
        rundir.truncate_metrics(run_dir, step)
    return step


def _time_limit_deadline(exp: Experiment) -> float | None:
    """A run with checkpoint=dcp under a scheduler's time limit: when the ranks are to checkpoint and stop."""
    if exp.checkpoint.kind != "dcp":
        return None
    return placement.nodes_of(exp.launcher).time_limit_deadline(exp, os.environ)


def launch(plan: Plan, run_dir: Path, *, origin: provenance.Origin | None = None) -> dict:
    """Run the checked `plan` in `run_dir` (the directory it was made for): write the run directory
    (plan.json and provenance.json included), run torchrun, complete an HF export, write
    summary.json; returns the summary. Raises ConfigError when torchtitan's own checks refuse the
    configuration in the ranks (torchrun is stopped first; no summary). `origin`: the command line
    and Hydra overrides, for provenance.json and the command that resumes. The wall time is the
    command's (`console.command_start`) for a run, the job's for a job of a sweep."""
    run_dir = Path(run_dir)
    if Path(plan.run_dir).resolve() != run_dir.resolve():
        raise ValueError(f"the plan was made for run directory {plan.run_dir}, not {run_dir}")
    exp, where = plan.exp, plan.placement
    console.tolerate_full_disk()
    begun, started = time.monotonic(), time.time()
    start = console.command_start(begun) if origin is not None and origin.mode == "RUN" else begun
    resumed_from = None
    logs = run_dir / rundir.LOGS
    earlier = timelimit.earlier_attempts(run_dir, experiment_hash(exp)) if where.node_rank == 0 else []
    reserve = outcome.SummaryReserve(logs / node_file(outcome.SUMMARY_RESERVE, where))
    with StopSignals(logs) as stop:
        try:
            resumed_from, env = _prepare_run_dir(plan, run_dir, origin)
            reserve.make()
            watch = progress.Watch(
                run_dir / rundir.METRICS,
                exp.training.steps,
                verbose=exp.verbose,
                node_rank=where.node_rank,
                stopping=lambda: stop.signum is not None,
            )
            code = run_torchrun(
                plan.command,
                env,
                exp.launcher.stop_timeout_s,
                stop,
                job_config.refusal_path(run_dir),
                deadline=_time_limit_deadline(exp),
                on_line=watch.line,
                on_tick=watch.tick,
            )
            watch.finish()
        except Interrupted:
            code = None
        except BaseException:
            reserve.release()
            raise
        finally:
            console.end_live()  # what comes next (a refusal on stderr, the outcome) starts a line of its own
    try:
        if stop.signum is None and code != 0 and (refused := job_config.read_refusal(run_dir)) is not None:
            raise refused
        ended = outcome.status(plan, run_dir, code, stop.signum, ranks_started=stop.proc is not None, since=started)
    finally:
        reserve.release()  # the ranks are gone: the room held for the summary and the last lines
    return _finish(
        plan, run_dir, stop, origin, ended, started=started, start=start, resumed_from=resumed_from, earlier=earlier
    )


def _finish(
    plan: Plan,
    run_dir: Path,
    stop: StopSignals,
    origin: provenance.Origin | None,
    ended: tuple[str, int, str | None],
    *,
    started: float,
    start: float,
    resumed_from: int | None,
    earlier: list[dict],
) -> dict:
    """After the ranks: the HF export (a completed run's), summary.json with every attempt (node 0),
    the last line. `ended`: (status, exit code, error) of the torchrun run."""
    exp, where = plan.exp, plan.placement
    status, exit_code, error = ended
    export = None
    if status == "completed" and exp.checkpoint.exports:
        export = outcome.finish_export(plan, run_dir)
        if not export["ok"]:
            status, exit_code, error = "failed", 1, f"the Hugging Face export does not verify: {export['error']}"
    wall = time.monotonic() - start
    # Node 0: every attempt in this run directory (requeues of a SLURM job, relaunches).
    this = timelimit.attempt_record(
        os.environ,
        number=len(earlier) + 1,
        status=status,
        started=started,
        wall=wall,
        resumed_from=resumed_from,
        error=error,
        steps=rundir.read_metrics(run_dir),
    )
    summary = outcome.summarize(
        plan,
        run_dir,
        exit_code=exit_code,
        status=status,
        wall=wall,
        error=error,
        resumed_from=resumed_from,
        export=export,
        extra={"attempts": [*earlier, this]} if where.node_rank == 0 else None,
    )
    if stop.signum is not None:
        console.logger("qwen3exp.launch").warning(
            outcome.stopped_line(plan, run_dir, stop.signum, origin, ranks_started=stop.proc is not None)
        )
    else:
        outcome.say(summary, run_dir)
    return summary


def _prepare_run_dir(plan: Plan, run_dir: Path, origin: provenance.Origin | None) -> tuple[int | None, dict]:
    """Everything before torchrun starts: the run files, provenance, metrics.jsonl reset (node 0),
    the ranks' environment, the opening lines. Returns (the checkpoint step resumed from, the env)."""
    exp, where, facts = plan.exp, plan.placement, plan.platform
    log = console.logger("qwen3exp.launch")
    logs = run_dir / rundir.LOGS
    if where.nnodes == 1:
        _wait_until_free(run_dir, exp.launcher.stop_timeout_s + 5)
    write_run_files(plan, run_dir)
    provenance.write(run_dir, facts, experiment_hash(exp), origin)
    # Node 0 only: the ranks (also those of the other nodes) cannot start before its agent joins.
    resumed_from = _reset_metrics(exp, run_dir) if where.node_rank == 0 else None
    job_config.refusal_path(run_dir).unlink(missing_ok=True)  # an earlier launch's, in a relaunched directory
    if where.node_rank == 0:
        timelimit.clear(logs)
    env = rank_env(facts, run_dir)
    env.update(tracking.env(exp, run_dir, sweep_dir=origin.sweep_dir if origin else None))
    node = f"node {where.node_rank}/{where.nnodes} ({where.how}), " if where.nnodes > 1 else ""
    log.info(
        f"qwen3exp: {exp.name}: {plan.mesh.world_size} rank(s) on {facts.name} "
        f"({facts.reason}); {node}run directory {run_dir}"
        + (f"; resuming from checkpoint step {resumed_from}" if resumed_from is not None else "")
    )
    log.debug("%s", render.render(plan, title=f"the plan of {exp.name}:"))
    for w in plan.warnings:
        log.warning(f"qwen3exp: warning: {w}")
    log.debug("command: %s", shlex.join(redact.redact_argv(plan.command)))
    if where.nnodes > 1:
        log.info(
            f"qwen3exp: waiting for {where.nnodes} node(s) to join the rendezvous "
            f"(up to launcher.rdzv_timeout_s={exp.launcher.rdzv_timeout_s:g}s)",
            extra=console.LIVE,
        )
    else:
        log.info(f"qwen3exp: starting {plan.mesh.world_size} rank(s)", extra=console.LIVE)
    return resumed_from, env


def prepare(exp: Experiment, env: Mapping[str, str] | None = None) -> Prepared:
    """`plan.build.prepare` with the torchtitan adapter's kernel override matcher (for tests and
    notebooks; a launch runs make_plan's Plan)."""
    return _prepare(exp, env, claims_of=job_config.override_claims)


# ------------------------------------------------------------------------------ the launcher
class Local:
    """`Launcher` of `LocalLauncher`: the jobs run here (`launch` in this process, or a joblib pool)."""

    hands_over = False

    def batch_problem(self, sections: Sequence[object]) -> Problem | None:
        return None  # each local job runs with its own launcher section

    def submit_problem(self) -> Problem | None:
        return None

    def submit(self, submission: Submission, overrides: list, first: int) -> list:
        """sweep.parallel_jobs > 1: the jobs go to hydra-joblib-launcher's JoblibLauncher (a pool of
        that many processes); each job process runs its job like a local one."""
        from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher  # lazy: optional extra
        from joblib.externals.loky import get_reusable_executor  # lazy: optional extra

        n_jobs = submission.exp.sweep.parallel_jobs
        print(f"qwen3exp: running {len(overrides)} job(s), {n_jobs} at a time (hydra-joblib-launcher)", flush=True)
        # max_nbytes=None: nothing is memory-mapped (a job gets a few override strings), so joblib
        # makes no temporary folder in /dev/shm that would be left for its resource tracker at exit.
        inner = JoblibLauncher(n_jobs=n_jobs, prefer="processes", max_nbytes=None)
        inner.setup(
            hydra_context=submission.hydra_context, task_function=submission.task_function, config=submission.config
        )
        try:
            return list(inner.launch(overrides, initial_job_idx=first))
        finally:
            # joblib keeps its worker processes for reuse (loky's idle timeout is 300 s): they would
            # outlive the sweep, holding its terminal and pipes. Nothing reuses them: stop them now.
            get_reusable_executor().shutdown(wait=True)

    def may_join(self, exp: Experiment, run_dir: Path) -> bool:
        return may_join(exp, run_dir)

    def after_job(self, run_dir: Path, summary: dict) -> dict:
        return summary

    def cancel(self, sweep_dir: Path) -> None:
        return None  # the jobs ran in this process: a signal stopped them already

    def job_logs(self, run_dir: Path) -> Path | None:
        return None


LAUNCHER = Local()

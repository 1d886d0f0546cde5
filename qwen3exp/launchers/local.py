"""The local launcher (`launcher=local`): each job runs in this process, the jobs of a batch one
after the other (or in a joblib pool with `sweep.parallel_jobs` above 1); and the launch of one
node's ranks, which a SLURM job runs too, on its first node (`launch`).

`launch(plan, run_dir)` runs a Plan (`qwen3exp.plan.build.make_plan`: every check that can fail on
a bad configuration, and everything resolved: platform, mesh, batches, node placement, override
claims, this node's torchrun command) and resolves nothing again. It writes the run directory (with
`provenance.json`: where the run came from; `qwen3exp.launchers.prelaunch`), starts torchrun (or
srun starting one torchrun agent per node) at once and supervises it (`qwen3exp.launchers.torchrun`):
- torchtitan's own config checks run in the ranks, before the trainer is built (the launcher does
  not import torch or torchtitan for a plain experiment: the ranks import them anyway). A rank they
  refuse records a ConfigError (`qwen3exp.titan.refusal`); the launcher stops
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
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from qwen3exp import platforms
from qwen3exp.config.schema import Experiment
from qwen3exp.errors import Problem
from qwen3exp.launchers import exports, lm_eval_run, outcome, prelaunch
from qwen3exp.launchers.outcome import experiment_hash, node_file
from qwen3exp.launchers.protocol import Submission, may_join
from qwen3exp.launchers.torchrun import Interrupted, StopSignals, run_torchrun
from qwen3exp.plan import placement
from qwen3exp.plan.build import Plan, Prepared, prepare as _prepare
from qwen3exp.run import console, metrics_file, progress, provenance, rundir, timelimit
from qwen3exp.titan import job_config, refusal


def _time_limit_deadline(exp: Experiment) -> float | None:
    """A run with checkpoint.save=true under a scheduler's time limit: when the ranks are to checkpoint and stop."""
    if not exp.checkpoint.resumable:
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
            resumed_from, env = prelaunch.prepare_run_dir(plan, run_dir, origin)
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
                refusal.refusal_path(run_dir),
                deadline=_time_limit_deadline(exp),
                on_line=watch.line,
                on_tick=watch.tick,
                fork=platforms.agent_forks(plan.platform),
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
        if stop.signum is None and code != 0 and (refused := refusal.read_refusal(run_dir)) is not None:
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
    """After the ranks: the HF export (a completed run's), eval=lm_eval on it (node 0), summary.json
    with every attempt (node 0), the last line. `ended`: (status, exit code, error) of the torchrun run."""
    exp, where = plan.exp, plan.placement
    status, exit_code, error = ended
    export = None
    if status == "completed" and exp.checkpoint.exports:
        export = exports.finish_export(plan, run_dir)
        if not export["ok"]:
            status, exit_code, error = "failed", 1, f"the Hugging Face export does not verify: {export['error']}"
    evaluated = None
    if status == "completed" and lm_eval_run.wanted(exp) and where.node_rank == 0:
        evaluated = lm_eval_run.after_training(plan, run_dir)
        status, exit_code, error = lm_eval_run.outcome(evaluated, (status, exit_code, error))
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
        steps=metrics_file.read_metrics(run_dir),
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
        extra={"attempts": [*earlier, this], **(lm_eval_run.summary_fields(exp, evaluated) if evaluated else {})}
        if where.node_rank == 0
        else None,
    )
    if stop.signum is not None:
        console.logger("qwen3exp.launch").warning(
            outcome.stopped_line(plan, run_dir, stop.signum, origin, ranks_started=stop.proc is not None)
        )
    else:
        outcome.say(summary, run_dir)
    return summary


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
        as many processes as this host takes at once, `plan.host_share`); each job process runs its
        job like a local one."""
        from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher  # lazy: optional extra
        from joblib.externals.loky import get_reusable_executor  # lazy: optional extra

        n_jobs = submission.jobs_at_once
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

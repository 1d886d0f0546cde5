"""SLURM through hydra-submitit-launcher (`launcher=slurm`).

Submitting (the command line, on the submit host): qwen3exp's Hydra launcher checks the batch, then
hands it to hydra-submitit-launcher's SlurmLauncher set up with `submitit_params()` from the validated
`launcher` section. It submits one job per run (a job array for a sweep), and each job runs the plan
the launcher made for it (`qwen3exp.launchers.job.run_planned`: nothing is checked or planned again)
like a local one, once, on the first node of its allocation (`use_srun=false`: submitit would otherwise
run it once per SLURM task). The run directory must be on a shared file system.

In the job (`qwen3exp.plan.slurm_nodes`): with one node torchrun starts directly; with several, the
job starts `srun` with one torchrun agent per node and a c10d rendezvous on a free port of the first
node (where the job runs). `--kill-on-bad-exit` ends every node's agent when one fails. Hydra never runs
on the other nodes or in the ranks.

`LAUNCHER` is this module's `Launcher` (`qwen3exp.launchers.protocol`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from qwen3exp.config.schema import Experiment
from qwen3exp.config.sections.launcher import SlurmLauncher
from qwen3exp.errors import Problem
from qwen3exp.launchers.protocol import Submission, may_join
from qwen3exp.launchers.slurm_watch import (
    RESULT_GRACE_S as RESULT_GRACE_S,
    JobLost as JobLost,
    SqueueWatcher as SqueueWatcher,
    results_or_give_up,
)
from qwen3exp.run import rundir, timelimit


class Slurm:
    """`Launcher` of `SlurmLauncher`: every batch is handed to hydra-submitit-launcher (one SLURM job
    per run, a job array per sweep); the submit host waits for the jobs' results."""

    hands_over = True

    def batch_problem(self, sections: Sequence[object]) -> Problem | None:
        """hydra-submitit-launcher is set up once per batch, so every point must agree on the
        launcher section (a sweep over SLURM resources would silently submit every job with the
        first point's resources)."""
        if all(isinstance(la, SlurmLauncher) for la in sections) and all(la == sections[0] for la in sections):
            return None
        return Problem(
            "launcher",
            "differs between sweep points",
            "a sweep is submitted through one Hydra launcher with one set of SLURM resources",
            "the same launcher section for every point",
            "run one sweep per launcher setting",
        )

    def submit_problem(self) -> Problem | None:
        return controller_problem()

    def submit(self, submission: Submission, overrides: list, first: int) -> list:
        """The jobs go to hydra-submitit-launcher (a job array), set up from the validated launcher
        section; waits for their results."""
        from hydra_plugins.hydra_submitit_launcher.submitit_launcher import (  # lazy: optional extra
            SlurmLauncher as Submitit,
        )

        sweep_dir = submission.sweep_dir
        print(
            f"qwen3exp: submitting {len(overrides)} SLURM job(s) through hydra-submitit-launcher; "
            f"{'run' if submission.single else 'sweep'} directory {sweep_dir}",
            flush=True,
        )
        inner = Submitit(**submitit_params(submission.exp, sweep_dir))
        inner.setup(
            hydra_context=submission.hydra_context, task_function=submission.task_function, config=submission.config
        )
        with results_or_give_up(sweep_dir):
            return list(inner.launch(overrides, initial_job_idx=first))

    def may_join(self, exp: Experiment, run_dir: Path) -> bool:
        return may_join(exp, run_dir)

    def after_job(self, run_dir: Path, summary: dict) -> dict:
        if summary.get("status") == "requeued":  # SLURM's time limit: checkpoint saved, submitit requeues
            return requeue_this_job(run_dir, summary)
        return summary

    def cancel(self, sweep_dir: Path) -> None:
        """Ctrl-C or SIGTERM while waiting for SLURM jobs: cancel them and wait until they have ended
        (their launchers record the runs as interrupted)."""
        jobs = cancel_submitted(sweep_dir)
        print(f"qwen3exp: cancelled SLURM job(s) {', '.join(jobs) or '(none found)'}", file=sys.stderr, flush=True)
        wait_gone(jobs, timeout_s=60)

    def job_logs(self, run_dir: Path) -> Path | None:
        return run_dir / ".submitit"


LAUNCHER = Slurm()


def submitit_params(exp: Experiment, sweep_dir: Path) -> dict:
    """hydra-submitit-launcher's SlurmLauncher parameters for a launcher=slurm run or sweep, from
    the validated `launcher` section (every default lives in conf/launcher/slurm.yaml)."""
    la = exp.launcher
    assert isinstance(la, SlurmLauncher)
    sbatch: dict = {"requeue": True} if la.requeue else {}
    # UPSTREAM BUG: submitit 1.5.4 expects one result per SLURM task (nodes x tasks_per_node) even
    # with use_srun=False, where the batch script runs the function once: with nodes=2 the
    # submitter waited for task 1's result, which never comes, and never returned (issue 13).
    # submitit is told nodes=1 (one task, one result) and sbatch gets --nodes through
    # additional_parameters, which submitit writes last (tests/test_slurm.py::test_upstream_...).
    if la.nnodes > 1:
        sbatch["nodes"] = la.nnodes
    return {
        "submitit_folder": f"{sweep_dir}/.submitit/%j",
        # the job runs once, on the first node, and starts srun itself (see the module docstring).
        "use_srun": False,
        "nodes": 1,
        "tasks_per_node": 1,
        "cpus_per_task": la.cpus_per_node,
        "mem_gb": la.mem_gb,
        "gpus_per_node": la.gpus_per_node,
        "partition": la.partition,
        "account": la.account,
        "timeout_min": la.time_limit_min,
        # sbatch --signal=USR2@signal_delay_s: the pre-timeout signal (qwen3exp.run.timelimit).
        "signal_delay_s": la.signal_delay_s,
        # submitit requeues a job on its pre-timeout signal at most this many times.
        "max_num_timeout": la.max_requeues if la.requeue else 0,
        "additional_parameters": {**sbatch, **la.additional_parameters},
        "setup": list(la.setup),
        "array_parallelism": la.array_parallelism,
        "name": exp.name,
    }


def controller_problem() -> Problem | None:
    """A real launch with launcher=slurm needs sbatch and a controller that answers (`scontrol
    ping`), checked before anything is written; None when both are there."""
    allowed = "a SLURM submit host whose controller is up, or launcher=local"
    if shutil.which("sbatch") is None or shutil.which("scontrol") is None:
        return Problem(
            "launcher", "slurm", "cannot reach a SLURM controller: sbatch/scontrol are not on PATH here", allowed
        )
    try:
        r = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Problem(
            "launcher", "slurm", f"cannot reach the SLURM controller (scontrol ping: {type(e).__name__})", allowed
        )
    text = (r.stdout + r.stderr).strip()
    if r.returncode != 0 or "DOWN" in text or "UP" not in text:
        first = text.splitlines()[0] if text else f"exit code {r.returncode}"
        return Problem(
            "launcher",
            "slurm",
            f"cannot reach the SLURM controller (scontrol ping: {first})",
            allowed,
            "start slurmctld, or check SLURM_CONF / the cluster's network",
        )
    return None


def cancel_submitted(sweep_dir: Path) -> list[str]:
    """scancel the jobs submitit submitted for this run or sweep (their folders under .submitit/
    are named after the job ids, array tasks as <array>_<task>); returns the job ids."""
    folder = sweep_dir / ".submitit"
    jobs = sorted({p.name.split("_")[0] for p in folder.iterdir() if p.is_dir()} if folder.is_dir() else set())
    jobs = [j for j in jobs if j.isdigit()]
    if jobs:
        subprocess.run(["scancel", *jobs], check=False)
    return jobs


def wait_gone(jobs: list[str], *, timeout_s: float) -> None:
    """Wait until SLURM no longer lists the jobs (their launchers have written their summaries)."""
    deadline = time.monotonic() + timeout_s
    while jobs and time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(jobs)], capture_output=True, text=True)
        if out.returncode != 0 or not out.stdout.strip():
            return
        time.sleep(0.5)


def requeue_this_job(run_dir: Path, summary: dict) -> dict:
    """In a SLURM job whose ranks saved a checkpoint at the pre-timeout signal (`summary`: the
    attempt, status `requeued`): hand that signal to submitit's own handler, which requeues the job
    (`scontrol requeue`, the same job id; the hydra-submitit callable resubmits itself with the
    same arguments) and ends this process (SystemExit, so no result is written and the submitter
    keeps waiting for the requeued job). SLURM does not signal the batch script's processes (see
    qwen3exp.run.timelimit), so submitit's handler has not run yet.
    Then the requeued job is let start again in seconds (`timelimit.restart_soon`). What goes
    wrong is said in the job's log and the summary: a start left to SLURM (about 2 minutes), or a
    requeue that failed (the run is then `interrupted`, returned, and the same command resumes)."""
    handler = signal.getsignal(signal.SIGUSR2)
    if not callable(handler):
        raise RuntimeError("not in a submitit job: no pre-timeout signal handler to requeue with")
    job = os.environ["SLURM_JOB_ID"]
    try:
        handler(signal.SIGUSR2, None)  # submitit's: checkpoint, requeue, sys.exit
    except SystemExit:
        if (trouble := timelimit.restart_soon(job)) is not None:
            _tell(run_dir, summary, trouble)
        raise
    except (OSError, subprocess.SubprocessError) as e:  # submitit's `scontrol requeue` failed
        return _tell(
            run_dir,
            {**summary, "status": "interrupted", "exit_code": 143},
            f"the requeue of SLURM job {job} failed ({type(e).__name__}: {e}): not requeued; "
            "the same command again resumes",
        )
    raise RuntimeError("submitit's pre-timeout handler returned without requeueing the job")


def _tell(run_dir: Path, summary: dict, trouble: str) -> dict:
    """Say it in the job's log (stderr) and in the run's summary (its error, and the attempt's)."""
    print(f"qwen3exp: {trouble}", file=sys.stderr, flush=True)
    attempts = [dict(a) for a in summary.get("attempts") or []]
    if attempts:
        attempts[-1].update(status=summary.get("status"), error=f"{attempts[-1].get('error') or ''}; {trouble}")
    summary = {**summary, "error": f"{summary.get('error') or ''}; {trouble}".lstrip("; "), "attempts": attempts}
    rundir.atomic_write_json(Path(run_dir) / rundir.SUMMARY, summary)
    return summary

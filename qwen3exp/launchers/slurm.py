"""SLURM through hydra-submitit-launcher (`launcher=slurm`).

Submitting (the command line, on the submit host): qwen3exp's Hydra launcher checks the batch, then
hands it to hydra-submitit-launcher's SlurmLauncher set up with `submitit_params()` from the validated
`launcher` section. It submits one job per run (a job array for a sweep), and each job runs
`qwen3exp.launchers.batch.task`, which checks and runs the job like a local one, once, on the
first node of its allocation (`use_srun=false`: submitit would otherwise run it once per SLURM
task). The run directory must be on a shared file system.

In the job (`placement()`): with one node torchrun starts directly; with several, the job starts
`srun` with one torchrun agent per node and a c10d rendezvous on a free port of the first node
(where the job runs). `--kill-on-bad-exit` ends every node's agent when one fails. Hydra never runs
on the other nodes or in the ranks.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

from qwen3exp.config.schema import Experiment, SlurmLauncher
from qwen3exp.errors import Problem


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
    import shutil

    allowed = "a SLURM submit host whose controller is up, or launcher=local"
    if shutil.which("sbatch") is None or shutil.which("scontrol") is None:
        return Problem("launcher", "slurm", "cannot reach a SLURM controller: sbatch/scontrol are not on PATH here",
                       allowed)
    try:
        r = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Problem("launcher", "slurm", f"cannot reach the SLURM controller (scontrol ping: {type(e).__name__})",
                       allowed)
    text = (r.stdout + r.stderr).strip()
    if r.returncode != 0 or "DOWN" in text or "UP" not in text:
        first = text.splitlines()[0] if text else f"exit code {r.returncode}"
        return Problem("launcher", "slurm", f"cannot reach the SLURM controller (scontrol ping: {first})", allowed,
                       "start slurmctld, or check SLURM_CONF / the cluster's network")
    return None


RESULT_GRACE_S = 15.0
"""After SLURM says a job has ended, how long the submitter still looks for its result file (a
shared file system may show it late; submitit itself waits as long)."""
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                   "DEADLINE", "PREEMPTED"})
"""squeue's final job states (a requeued job goes back to PENDING)."""


class JobLost(Exception):
    """A SLURM job ended and its result never appeared."""

    def __init__(self, job_id: str, state: str) -> None:
        super().__init__(job_id, state)
        self.job_id, self.state = job_id, state


@contextlib.contextmanager
def results_or_give_up(sweep_dir: Path, *, grace_s: float = RESULT_GRACE_S, poll_s: float = 5.0):
    """While hydra-submitit-launcher waits for the jobs' results: a job that SLURM says has ended,
    with no result `grace_s` later (its process was killed, its node lost), ends the wait with exit
    1 and a message naming the job and its logs.
    UPSTREAM BUG: submitit 1.5.4 learns a job's state only from sacct; without SLURM accounting
    every state is UNKNOWN ("Bypassing sacct error") and it waited for good for a job that died
    without writing its result (tests/test_slurm.py::test_a_job_killed_under_the_submitter_...).
    Its watcher is replaced by one that asks squeue for as long as this lasts."""
    from submitit.slurm import slurm as upstream

    saved = upstream.SlurmJob.watcher
    upstream.SlurmJob.watcher = SqueueWatcher(grace_s=grace_s, poll_s=poll_s)  # type: ignore[assignment]
    try:
        yield
    except JobLost as e:
        from submitit.core.utils import JobPaths

        paths = JobPaths(f"{sweep_dir}/.submitit/%j", job_id=e.job_id, task_id=0)
        state = "squeue no longer lists it" if e.state == "GONE" else e.state
        print(f"qwen3exp: SLURM job {e.job_id} ended ({state}) without a result: {paths.result_pickle.name} "
              f"did not appear within {grace_s:g} s (the job's process ended without writing it: killed, out of "
              f"memory, its node lost); not waiting any longer.\n  job logs: {paths.stderr}\n"
              f"            {paths.stdout}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    finally:
        upstream.SlurmJob.watcher = saved


class SqueueWatcher:
    """submitit's job watcher (what `SlurmJob.watcher` is asked), from squeue, which needs no
    accounting: a job has ended when squeue shows it in a final state or no longer knows it. A
    job's result file is what ends submitit's wait; a job that ended without one raises JobLost
    `grace_s` later (never in mode "cache": a Job's __del__ asks that way). squeue is asked every
    `poll_s` for the first minute, then every 30 s (a long job's submitter spares the controller)."""

    def __init__(self, *, grace_s: float, poll_s: float) -> None:
        self.grace_s, self.poll_s = grace_s, poll_s
        self.states: dict[str, str] = {}
        self._ended: dict[str, float] = {}
        self._checked = float("-inf")
        self._since = time.monotonic()

    def register_job(self, job_id: str) -> None:
        self.states.setdefault(job_id, "UNKNOWN")
        self._checked = float("-inf")

    def get_info(self, job_id: str, mode: str = "standard") -> dict[str, str]:
        if job_id not in self.states:
            self.register_job(job_id)
        now = time.monotonic()
        every = self.poll_s if now - self._since < 60 else max(self.poll_s, 30.0)
        if mode == "force" or (mode == "standard" and now - self._checked >= every):
            self.update()
        return {"State": self.states[job_id]}

    def get_state(self, job_id: str, mode: str = "standard") -> str:
        return self.get_info(job_id, mode)["State"]

    def is_done(self, job_id: str, mode: str = "standard") -> bool:
        state, now = self.get_state(job_id, mode), time.monotonic()
        if state not in ENDED and state != "GONE":
            self._ended.pop(job_id, None)
        elif mode != "cache" and now - self._ended.setdefault(job_id, now) >= self.grace_s:
            raise JobLost(job_id, state)
        return False  # a result file ends the wait (submitit looks for it first)

    def update(self) -> None:
        self._checked = time.monotonic()
        ids = sorted({j.split("_")[0] for j in self.states})
        try:
            out = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T", "-j", ",".join(ids)],
                                 capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return  # no answer says nothing about the jobs
        if out.returncode != 0 and "Invalid job id" not in out.stderr:
            return
        listed = dict(line.split("|", 1) for line in out.stdout.split() if "|" in line)
        for job in self.states:  # not listed any more: ended long enough ago to be forgotten
            self.states[job] = listed.get(job, "GONE")


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
    import signal

    from qwen3exp.run import timelimit

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
        return _tell(run_dir, {**summary, "status": "interrupted", "exit_code": 143},
                     f"the requeue of SLURM job {job} failed ({type(e).__name__}: {e}): not requeued; "
                     "the same command again resumes")
    raise RuntimeError("submitit's pre-timeout handler returned without requeueing the job")


def _tell(run_dir: Path, summary: dict, trouble: str) -> dict:
    """Say it in the job's log (stderr) and in the run's summary (its error, and the attempt's)."""
    from qwen3exp.run import rundir

    print(f"qwen3exp: {trouble}", file=sys.stderr, flush=True)
    attempts = [dict(a) for a in summary.get("attempts") or []]
    if attempts:
        attempts[-1].update(status=summary.get("status"), error=f"{attempts[-1].get('error') or ''}; {trouble}")
    summary = {**summary, "error": f"{summary.get('error') or ''}; {trouble}".lstrip("; "), "attempts": attempts}
    rundir.atomic_write_json(Path(run_dir) / rundir.SUMMARY, summary)
    return summary


def time_limit_deadline(la: SlurmLauncher, env) -> float | None:
    """In a SLURM job: when (time.time()) the pre-timeout checkpoint is due, from the job's EndTime
    (`squeue -o %e`) minus `launcher.signal_delay_s`. The launcher records the request itself then,
    should SLURM's own signal not have come: it never reaches the batch script's processes, and
    after a requeue SLURM 22.05 did not send it again (measured). None outside a job."""
    import datetime

    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%e"], capture_output=True, text=True, timeout=30)
        end = datetime.datetime.fromisoformat(out.stdout.strip().splitlines()[0])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    return end.timestamp() - la.signal_delay_s

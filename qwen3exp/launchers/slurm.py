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

import subprocess
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
    import time

    deadline = time.monotonic() + timeout_s
    while jobs and time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(jobs)], capture_output=True, text=True)
        if out.returncode != 0 or not out.stdout.strip():
            return
        time.sleep(0.5)


def requeue_this_job() -> None:
    """In a SLURM job whose ranks saved a checkpoint at the pre-timeout signal: hand that signal to
    submitit's own handler, which requeues the job (`scontrol requeue`, the same job id; the
    hydra-submitit callable resubmits itself with the same arguments) and ends this process
    (SystemExit, so no result is written and the submitter keeps waiting for the requeued job).
    SLURM does not signal the batch script's processes (see qwen3exp.run.timelimit), so submitit's
    handler has not run yet."""
    import signal

    handler = signal.getsignal(signal.SIGUSR2)
    if not callable(handler):
        raise RuntimeError("not in a submitit job: no pre-timeout signal handler to requeue with")
    try:
        handler(signal.SIGUSR2, None)  # submitit's: checkpoint, requeue, sys.exit
    except SystemExit:
        # SLURM holds a requeued job back (BeginTime; 144 s measured here on 22.05); it may start
        # again a few seconds from now. Not at once: a restart within the second of the requeue was
        # refused by the nodes ("Job credential revoked", the job then ended without a result and
        # the submitter waited for good; seen on the two-node test cluster).
        import os

        subprocess.run(["scontrol", "update", f"JobId={os.environ['SLURM_JOB_ID']}", "StartTime=now+5"],
                       check=False, capture_output=True, timeout=30)
        raise
    raise RuntimeError("submitit's pre-timeout handler returned without requeueing the job")


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

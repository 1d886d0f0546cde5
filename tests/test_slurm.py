"""launcher=slurm for real: a one-node SLURM cluster (Debian's slurmctld, slurmd and munge, started
by tests/slurm/setup_slurm.sh and stopped again at the end) runs a tiny training submitted
through hydra-submitit-launcher, a 2-point sweep as a job array of two jobs, and a run whose
submitter gets Ctrl-C (its job is cancelled and records the run as interrupted).

Needs root (the daemons) and SLURM installed or apt-get to install it; elsewhere these tests skip
and say why. CI runs as root with apt, so there they run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

from conftest import REPO, read_metrics, read_summary, run_cli
from qwen3exp.run import rundir
from runprocs import assert_no_survivors, kill_leftovers, start_cli, wait_for

pytestmark = pytest.mark.slow

SETUP = REPO / "tests" / "slurm" / "setup_slurm.sh"
# One rank per job and one CPU each, so the two jobs of the sweep run side by side on 2 cores.
ARGS = ("launcher=slurm", "launcher.nproc_per_node=1", "launcher.cpus_per_node=1", "launcher.time_limit_min=10",
        "platform=cpu", "training.steps=4", "training.warmup_steps=1", "training.seq_len=64",
        "training.local_batch_size=2", "metrics.tensorboard=false")


def _why_not() -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root to start slurmctld, slurmd and munged"
    if not (shutil.which("slurmctld") or shutil.which("apt-get")):
        return "SLURM is not installed and apt-get is not available to install it"
    return None


@pytest.fixture(scope="module")
def cluster():
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    already_up = subprocess.run([str(SETUP), "status"], capture_output=True).returncode == 0
    r = subprocess.run([str(SETUP), "start"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"setup_slurm.sh start failed:\n{r.stdout}\n{r.stderr}"
    yield socket.gethostname().split(".")[0]
    if not already_up:  # stop only what this fixture started
        subprocess.run([str(SETUP), "stop"], capture_output=True, timeout=120)


def _jobs_ended_then_no_survivors(run_dir) -> None:
    """The submitter returns once the job's result is written; the job's Python process may still be
    tearing down (torch takes seconds). Wait for SLURM to report no job, then check /proc."""
    deadline = time.monotonic() + 120
    while subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout.strip():
        assert time.monotonic() < deadline, "SLURM jobs still running 2 minutes after the results came back"
        time.sleep(0.2)
    # The job's Python process may still be tearing down (seconds, after its result is written).
    assert_no_survivors(run_dir, grace=60)


def test_a_run_through_slurm(cluster, tmp_path):
    run = tmp_path / "run"
    r = run_cli(*ARGS, f"hydra.run.dir={run}")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    s = read_summary(run)
    assert s["status"] == "completed" and s["steps_completed"] == 4 and s["world_size"] == 1
    assert len(read_metrics(run)) == 4
    # It ran as a SLURM job (submitit's folder holds the sbatch script), on one node: torchrun directly.
    (job,) = [p for p in (run / ".submitit").iterdir() if p.is_dir()]
    script = next(job.glob("*_submission.sh")).read_text()
    assert "#SBATCH --nodes=1" in script and "#SBATCH --cpus-per-task=1" in script
    assert "srun" not in script  # _task runs once; it starts the agents itself
    assert (run / "command.txt").read_text().split()[1:4] == ["-m", "qwen3exp.run.agent", "--nnodes"]
    _jobs_ended_then_no_survivors(run)


def test_a_sweep_is_a_job_array(cluster, tmp_path):
    sweep = tmp_path / "sweep"
    r = run_cli("-m", *ARGS, "launcher.srun=true", "training.seed=1,2", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "qwen3exp sweep finished" in r.stdout and "2 completed" in r.stdout  # the end-of-sweep table
    found = {rundir.read_experiment(p)["training"]["seed"]: p for p in rundir.find_runs(sweep)}
    assert sorted(found) == [1, 2]
    runs = [found[1], found[2]]
    summaries = [read_summary(run) for run in runs]
    assert [s["status"] for s in summaries] == ["completed", "completed"]
    assert summaries[0]["first_loss"] != summaries[1]["first_loss"]  # two seeds, two trainings
    jobs = sorted(p.name for p in (sweep / ".submitit").iterdir() if p.is_dir() and "_" in p.name)
    array = jobs[0].split("_")[0]
    assert jobs == [f"{array}_0", f"{array}_1"]  # one array, two tasks
    # srun started the torchrun agent, with the c10d rendezvous on the job's first node.
    for run in runs:
        command = (run / "command.txt").read_text()
        assert command.startswith("srun --nodes=1 --ntasks-per-node=1 --cpus-per-task=1 --kill-on-bad-exit=1 ")
        assert f"--rdzv-endpoint {cluster}:" in command
        assert json.loads((run / "summary.json").read_text())["exit_code"] == 0
        assert json.loads((run / "plan.json").read_text())["commands"] == [command.strip()]
    _jobs_ended_then_no_survivors(sweep)


def test_ctrl_c_while_waiting_cancels_the_job(cluster, tmp_path):
    """Ctrl-C on the submitting command cancels its jobs (scancel); in the job, the launcher
    stops torchrun and the ranks and records the run as interrupted."""
    run = tmp_path / "run"
    proc = start_cli(*ARGS, "training.steps=400", f"hydra.run.dir={run}", log=tmp_path / "log")
    try:
        wait_for(lambda: (run / "command.txt").is_file(), proc=proc, what="the job to start torchrun")
        time.sleep(3)  # torchrun and its rank are starting
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130, (tmp_path / "log").read_text()[-3000:]
        wait_for(lambda: (run / "summary.json").is_file(), timeout=60, what="the job's summary")
        _jobs_ended_then_no_survivors(run)
    finally:
        kill_leftovers(run)
    s = read_summary(run)
    assert s["status"] == "interrupted" and s["exit_code"] == 143 and s["error"].startswith("stopped by SIGTERM")


def _submitted_job(tmp_path, monkeypatch, params: dict):
    """Submit through submitit's public SlurmExecutor with a fake sbatch (no cluster): the job
    object and the sbatch script submitit wrote."""
    import submitit

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 'Submitted batch job 42'\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    executor = submitit.SlurmExecutor(folder=tmp_path / "submitit")
    executor.update_parameters(**params)
    job = executor.submit(print, "hello")
    return job, job.paths.submission_file.read_text()


def test_upstream_submitit_multinode_workaround(tmp_path, monkeypatch):
    """UPSTREAM BUG (submitit 1.5.4, qwen3exp/launchers/slurm.py): with use_srun=False the batch
    script runs the function once, yet submitit waits for nodes x tasks_per_node results; the
    submitter of a 2-node job never returned. The parameters qwen3exp passes make it wait for one
    result while sbatch still gets --nodes=2."""
    from conftest import compose
    from qwen3exp.config.schema import validate_experiment
    from qwen3exp.launchers import slurm

    exp = validate_experiment(compose("launcher=slurm", "launcher.nnodes=2", "launcher.nproc_per_node=1"))
    p = slurm.submitit_params(exp, tmp_path)
    ours = {"nodes": p["nodes"], "ntasks_per_node": p["tasks_per_node"], "use_srun": p["use_srun"],
            "additional_parameters": p["additional_parameters"]}
    job, script = _submitted_job(tmp_path / "ours", monkeypatch, ours)
    assert job.num_tasks == 1 and "#SBATCH --nodes=2\n" in script and "srun" not in script
    # Upstream still counts every SLURM task (when this fails, submitit is fixed: drop the workaround).
    job, script = _submitted_job(tmp_path / "plain", monkeypatch,
                                 {"nodes": 2, "ntasks_per_node": 1, "use_srun": False})
    assert job.num_tasks == 2 and "#SBATCH --nodes=2\n" in script

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

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # alone, after the parallel part (pyproject.toml)

SETUP = REPO / "tests" / "slurm" / "setup_slurm.sh"
# One rank per job and one CPU each, so the two jobs of the sweep run side by side on 2 cores.
ARGS = (
    "launcher=slurm",
    "launcher.nproc_per_node=1",
    "launcher.cpus_per_node=1",
    "launcher.time_limit_min=10",
    "platform=cpu",
    "training.steps=4",
    "training.warmup_steps=1",
    "training.seq_len=64",
    "training.local_batch_size=2",
    "metrics.tensorboard=false",
)


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
    proc = start_cli(*ARGS, "training.steps=100000", f"hydra.run.dir={run}", log=tmp_path / "log")
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
    ours = {
        "nodes": p["nodes"],
        "ntasks_per_node": p["tasks_per_node"],
        "use_srun": p["use_srun"],
        "additional_parameters": p["additional_parameters"],
    }
    job, script = _submitted_job(tmp_path / "ours", monkeypatch, ours)
    assert job.num_tasks == 1 and "#SBATCH --nodes=2\n" in script and "srun" not in script
    # Upstream still counts every SLURM task (when this fails, submitit is fixed: drop the workaround).
    job, script = _submitted_job(tmp_path / "plain", monkeypatch, {"nodes": 2, "ntasks_per_node": 1, "use_srun": False})
    assert job.num_tasks == 2 and "#SBATCH --nodes=2\n" in script


# ------------------------------------------------- the submitter gives up on a job without a result
def test_a_job_killed_under_the_submitter_ends_its_wait_naming_the_job(cluster, tmp_path):
    """The job's own process is SIGKILLed (no result pickle is ever written): once SLURM says the job
    has ended, the submitter waits qwen3exp.launchers.slurm.RESULT_GRACE_S for the result, then exits 1 naming the
    job and its logs (it used to wait for good: without accounting submitit's sacct knows no state)."""
    from qwen3exp.launchers.slurm import RESULT_GRACE_S

    run, log = tmp_path / "run", tmp_path / "log"
    proc = start_cli(*ARGS, "training.steps=100000", f"hydra.run.dir={run}", log=log)
    try:
        jobs = lambda: [p.name for p in (run / ".submitit").glob("*") if p.is_dir()]  # noqa: E731
        wait_for(lambda: bool(jobs()), proc=proc, timeout=120, what="the submission")
        (job,) = jobs()

        def running() -> bool:
            state = subprocess.run(
                ["squeue", "-h", "-o", "%T", "-j", job.split("_")[0]], capture_output=True, text=True
            )
            return state.stdout.strip() == "RUNNING"

        wait_for(running, proc=proc, timeout=120, what=f"job {job} to run")
        subprocess.run(["scancel", "--signal=KILL", "--full", job.split("_")[0]], check=True)
        killed = time.monotonic()
        code = proc.wait(timeout=RESULT_GRACE_S + 60)
        waited = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_leftovers(run)
    out = log.read_text()
    print(f"the submitter gave up {waited:.1f} s after the job was killed")
    assert code == 1, out[-3000:]
    assert f"qwen3exp: SLURM job {job} ended (" in out and "without a result" in out
    assert str(run / ".submitit" / job / f"{job}_0_log.err") in out
    assert str(run / ".submitit" / job / f"{job}_0_log.out") in out
    assert "Traceback" not in out
    assert RESULT_GRACE_S <= waited < RESULT_GRACE_S + 30
    _jobs_ended_then_no_survivors(run)


def test_the_squeue_watcher_gives_up_only_on_an_ended_job(tmp_path, monkeypatch):
    """No cluster: a fake squeue says RUNNING, then FAILED, then no longer knows the job."""
    from qwen3exp.launchers import slurm

    answer = tmp_path / "answer"
    _fake_tool(
        tmp_path,
        monkeypatch,
        "squeue",
        f'cat "{answer}"; [ ! -s "{answer}" ] && '
        'echo "slurm_load_jobs error: Invalid job id specified" >&2 && exit 1; exit 0',
    )
    watcher = slurm.SqueueWatcher(grace_s=0.3, poll_s=0)
    answer.write_text("41_0|RUNNING\n")
    watcher.register_job("41_0")
    assert not watcher.is_done("41_0") and watcher.get_state("41_0") == "RUNNING"
    answer.write_text("41_0|FAILED\n")
    assert not watcher.is_done("41_0")  # ended: the result may still appear for grace_s
    assert not watcher.is_done("41_0", mode="cache")
    time.sleep(0.35)
    with pytest.raises(slurm.JobLost, match="41_0"):
        watcher.is_done("41_0")
    answer.write_text("")  # purged: squeue says "Invalid job id"
    lost = slurm.SqueueWatcher(grace_s=0, poll_s=0)
    lost.register_job("41_0")
    with pytest.raises(slurm.JobLost) as e:
        lost.is_done("41_0")
    assert e.value.state == "GONE"


# --------------------------------------------------------------- the requeued job starts soon
def _fake_tool(tmp_path, monkeypatch, name: str, body: str):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
    (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


FAKE_SCONTROL = r'''#!{python}
"""scontrol as a requeued job sees it: KillWait 2 s; `update` fails (exit 1) the first FAIL times,
is ignored (exit 0, SLURM keeps its own start, as measured) the next IGNORE times, then holds."""
import os, sys
d, args = os.environ["FAKE_SCONTROL"], sys.argv[1:]
open(f"{d}/calls", "a").write(" ".join(args) + "\n")
fail, ignore, requeue_fails = (int(os.environ[k]) for k in ("FAIL", "IGNORE", "REQUEUE_FAILS"))
if args[:2] == ["show", "config"]:
    print("KillTimeout = 0\nKillWait                = 2 sec\nMinJobAge = 300 sec")
elif args[0] == "requeue" and requeue_fails:
    print("scontrol: error: Requeue failed", file=sys.stderr)
    sys.exit(1)
elif args[0] == "update":
    n = sum(1 for line in open(f"{d}/calls") if line.startswith("update")) - 1
    if n < fail:
        print("slurm_update error: Socket timed out on send/recv operation", file=sys.stderr)
        sys.exit(1)
    if n >= fail + ignore:
        open(f"{d}/eligible", "w").write(args[2].split("=", 1)[1])
elif args[0] == "-o":  # -o show job ID
    eligible = open(f"{d}/eligible").read() if os.path.exists(f"{d}/eligible") else "2030-01-01T00:02:01"
    print(f"JobId={args[3]} JobName=x JobState=COMPLETING Reason=None Restarts=1 EligibleTime={eligible} X=")
'''


@pytest.fixture
def requeue(tmp_path, monkeypatch):
    """requeue_this_job in this process with a fake scontrol, and submitit's pre-timeout handler
    stood in for (what it does: `scontrol requeue`, then sys.exit)."""
    import sys

    from qwen3exp.run import timelimit

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL.replace("{python}", sys.executable))
    (bin_dir / "scontrol").chmod(0o755)
    for key, value in {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_SCONTROL": str(tmp_path),
        "SLURM_JOB_ID": "77",
        "FAIL": "0",
        "IGNORE": "0",
        "REQUEUE_FAILS": "0",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(timelimit, "RESTART_PAUSE_S", 0.01)

    def submitits_handler(_signum, _frame):
        subprocess.check_call(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]])
        sys.exit(-1)

    previous = signal.signal(signal.SIGUSR2, submitits_handler)
    run = tmp_path / "run"
    run.mkdir()
    why = "stopped at the SLURM time limit after step 3, checkpoint step-3 saved; requeued (attempt 1 of at most 4)"
    summary = {
        "status": "requeued",
        "exit_code": 0,
        "error": why,
        "attempts": [{"attempt": 1, "job_id": "77", "status": "requeued", "error": why}],
    }
    yield run, summary, lambda: (tmp_path / "calls").read_text().splitlines()
    signal.signal(signal.SIGUSR2, previous)


def test_the_requeued_job_is_let_start_again_in_seconds_retrying_the_update(requeue, monkeypatch, capsys):
    """`scontrol update StartTime` failed once and was ignored once (SLURM kept its ~2 minutes):
    retried until SLURM shows the start asked for, KillWait + 5 s ahead (after this process is
    certainly gone: SLURM replaces a start that passed before the requeue completed)."""
    import datetime

    from qwen3exp.launchers import slurm

    run, summary, calls = requeue
    monkeypatch.setenv("FAIL", "1")
    monkeypatch.setenv("IGNORE", "1")
    before = datetime.datetime.now().replace(microsecond=0)
    with pytest.raises(SystemExit):  # requeued: no result, the submitter keeps waiting
        slurm.requeue_this_job(run, summary)
    updates = [c for c in calls() if c.startswith("update")]
    assert calls()[0] == "requeue 77" and len(updates) == 3
    start = datetime.datetime.fromisoformat(updates[-1].split("StartTime=")[1])
    assert datetime.timedelta(seconds=2 + 5) <= start - before <= datetime.timedelta(seconds=2 + 5 + 3)
    assert capsys.readouterr().err == "" and not (run / "summary.json").exists()  # nothing to tell


def test_a_requeued_job_whose_start_cannot_be_set_says_so_in_its_log_and_summary(requeue, monkeypatch, capsys):
    from qwen3exp.launchers import slurm
    from qwen3exp.run import timelimit

    run, summary, calls = requeue
    monkeypatch.setenv("FAIL", "99")
    with pytest.raises(SystemExit):  # it is requeued all the same: SLURM starts it later
        slurm.requeue_this_job(run, summary)
    assert len([c for c in calls() if c.startswith("update")]) == timelimit.RESTART_TRIES
    said = "SLURM job 77 was requeued, but its start could not be moved to 7 s from now after 8 tries"
    err = capsys.readouterr().err
    assert f"qwen3exp: {said}" in err and "Socket timed out on send/recv operation" in err
    s = read_summary(run)
    assert s["status"] == "requeued" and said in s["error"] and s["error"].startswith("stopped at the SLURM")
    assert said in s["attempts"][-1]["error"]


def test_a_failed_requeue_leaves_the_run_interrupted_and_says_why(requeue, monkeypatch, capsys):
    from qwen3exp.launchers import slurm

    run, summary, calls = requeue
    monkeypatch.setenv("REQUEUE_FAILS", "1")
    s = slurm.requeue_this_job(run, summary)  # returns: the job ends with this result
    assert (s["status"], s["exit_code"]) == ("interrupted", 143) and read_summary(run) == s
    assert "the requeue of SLURM job 77 failed (CalledProcessError" in s["error"]
    assert s["error"].endswith("not requeued; the same command again resumes")
    assert s["attempts"][-1]["status"] == "interrupted"
    assert "qwen3exp: the requeue of SLURM job 77 failed" in capsys.readouterr().err


# ------------------------------------------------------------------ two nodes bind like the local ones
def test_a_two_node_slurm_job_binds_like_a_launcher_per_node(tmp_path, monkeypatch):
    """Node 0 hosts the c10d store (is_host=true) and names the ranks' store by the address the other
    nodes reach (--local-addr, the endpoint's host); the others connect (is_host=false). srun starts
    node 0's command everywhere; the agent makes it another node's from SLURM_NODEID."""
    from conftest import compose
    from qwen3exp.config.schema import validate_experiment
    from qwen3exp.plan import placement, slurm_nodes
    from qwen3exp.run import agent

    def binding(argv: list[str]) -> tuple[str | None, str]:
        addr = argv[argv.index("--local-addr") + 1] if "--local-addr" in argv else None
        return addr, argv[argv.index("--rdzv-conf") + 1].rpartition("is_host=")[2]

    def agent_argv(command: list[str]) -> list[str]:
        return command[command.index("qwen3exp.run.agent") + 1 :]

    exp = validate_experiment(
        compose("launcher=slurm", "platform=cpu", "launcher.nnodes=2", "launcher.nproc_per_node=1")
    )
    monkeypatch.setattr(slurm_nodes, "hostnames", lambda nodelist: {"n[1-2]": ["n1", "n2"]}[nodelist])
    where = placement.resolve(
        exp, {"SLURM_JOB_ID": "9", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "n[1-2]"}
    )
    (command,) = placement.torchrun_commands(exp, where, nnodes=2, nproc_per_node=1, run_dir=tmp_path)
    assert command[0] == "srun" and where.rdzv_endpoint.startswith("n1:")
    assert binding(command) == ("n1", "true")  # node 0's, started on every node
    slurm_nodes_see = [binding(agent.for_this_node(agent_argv(command), node)) for node in (0, 1)]

    local = validate_experiment(
        compose(
            "platform=cpu",
            "launcher.nnodes=2",
            "launcher.nproc_per_node=1",
            f"launcher.rdzv_endpoint={where.rdzv_endpoint}",
            "launcher.node_rank=0",
        )
    )
    here = placement.resolve(local, {})
    local_nodes_see = [
        binding(agent.for_this_node(agent_argv(c), node))
        for node, c in enumerate(placement.torchrun_commands(local, here, nnodes=2, nproc_per_node=1, run_dir=tmp_path))
    ]
    assert slurm_nodes_see == local_nodes_see == [("n1", "true"), (None, "false")]

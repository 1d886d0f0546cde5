"""Two real nodes: a SLURM cluster of two network namespaces on this one machine (their own
addresses and hostnames, real TCP between them, one slurmctld, one slurmd each, a munged of its
own), started once for this module by tests/slurm/twonode.sh and removed again at the end (daemons
by pid file, namespaces, bridge, /etc/hosts lines), also when a test fails. The recipe and its
measurements: ../shared/notes/slurm.md ("Two nodes on one machine").

On it: a 2-node x 1-rank SLURM training returns within 30 s of its job's end and trains bit for
bit like 1 node x 2 ranks; a sweep of two 2-node jobs (a job array) ends with its table and
report; a job with a short time limit checkpoints at SLURM's pre-timeout signal, requeues itself
and resumes, with the losses of an uninterrupted run; a killed second-node agent fails the job
fast, the summary names node 1 and a relaunch resumes (that relaunch is the 2-node training
checked against 1 node x 2 ranks); Ctrl-C on the submitter stops both nodes;
the local launcher's two nodes (one per namespace) meet in a c10d rendezvous across them, and an
unreachable rendezvous fails within launcher.rdzv_timeout_s naming the endpoint. After every test
no process of its run is left (checked in /proc, which sees both namespaces).

Needs root (namespaces, the daemons) and SLURM installed; elsewhere these tests skip with the
reason. CI runs as root, so there they run.

Time: almost all of it is Python, torch and torchtitan starting in the agents and ranks of each
job, so scenarios that wait a lot share one test and run side by side (each node has room for two
1-CPU jobs), and a job that several scenarios need runs once: the reference 1-node x 2-rank run
trains while the cluster starts; the sweep's two jobs run while another job is stopped with Ctrl-C;
the time-limited job waits for its pre-timeout signal while a second-node agent is killed in
another job, whose relaunch is the plain 2-node run (it trains bit for bit like one node, its
submitter returns at once); the unreachable rendezvous times out while the local launcher's two
nodes train. Every scenario has its own run directory and its own SLURM jobs, and each test cleans
up its own runs (processes by run directory, jobs by id) also when it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO, read_metrics, read_summary
from runprocs import TINY, assert_no_survivors, env_with, free_port, kill_leftovers, metric_rows, start_cli, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # alone, after the parallel part (pyproject.toml)

SCRIPT = REPO / "tests" / "slurm" / "twonode.sh"
TWO_NODES = (
    *TINY,
    "launcher=slurm",
    "launcher.nnodes=2",
    "launcher.nproc_per_node=1",
    "launcher.cpus_per_node=1",
    "launcher.time_limit_min=10",
)


def _why_not() -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root for network namespaces and the SLURM daemons"
    for tool in ("slurmctld", "slurmd", "munged", "ip", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (.ci/run installs SLURM and munge)"
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True)
    if probe.returncode != 0:
        return f"cannot create a network namespace here: {probe.stderr.decode().strip()}"
    return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    state = tmp_path_factory.mktemp("twonode")
    # The reference run (1 node x 2 ranks, loopback) trains while the cluster starts (mostly waiting
    # for the slurmds to register).
    ref = tmp_path_factory.mktemp("reference") / "run"
    reference = start_cli(*TINY, "launcher.nproc_per_node=2", f"hydra.run.dir={ref}", log=ref.parent / "log")
    try:
        r = subprocess.run([str(SCRIPT), "start", str(state)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"twonode.sh start failed:\n{r.stderr}"
        info = dict(line.split("=", 1) for line in r.stdout.split() if "=" in line)
        info["nodes"], info["addrs"], info["netns"] = (info[k].split(",") for k in ("NODES", "ADDRS", "NETNS"))
        assert reference.wait(timeout=600) == 0, (ref.parent / "log").read_text()[-3000:]
        info["reference"] = [row["loss"] for row in read_metrics(ref)]
        assert len(info["reference"]) == 6
        yield info
    finally:
        if reference.poll() is None:
            reference.kill()
        kill_leftovers(ref)
        subprocess.run([str(SCRIPT), "stop", str(state)], capture_output=True, timeout=120)


@pytest.fixture
def reference_losses(cluster) -> list[float]:
    """conftest's reference_losses (an uninterrupted runprocs.TINY run on 1 node x 2 ranks), trained
    here while the cluster starts."""
    return cluster["reference"]


def _env(cluster, **extra) -> dict:
    return {"SLURM_CONF": cluster["SLURM_CONF"], **extra}


def _submit(cluster, *args, log: Path, **env) -> subprocess.Popen:
    return start_cli(*args, log=log, **_env(cluster, **env))


class _Returned:
    """Waits for a submitter in the background and notes when (wall clock) it returned, while the
    test drives another scenario."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.at = proc, None
        self._thread = threading.Thread(target=self._wait, daemon=True)
        self._thread.start()

    def _wait(self) -> None:
        self.proc.wait()
        self.at = time.time()

    def result(self, run_dir: Path, log: Path, timeout: float = 600) -> tuple[int, float]:
        self._thread.join(timeout)
        if self.at is None:
            self.proc.kill()
            raise AssertionError("the submitter did not return:\n" + log.read_text()[-3000:])
        return self.proc.returncode, self.at


def _finish(proc, run_dir: Path, log: Path, timeout: float = 600) -> tuple[int, float]:
    """Wait for the submitter; (exit code, monotonic time it returned)."""
    try:
        code = proc.wait(timeout=timeout)
        return code, time.monotonic()
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the submitter did not return:\n" + log.read_text()[-3000:]) from None


def _job_ids(run_dir: Path) -> list[str]:
    """The SLURM jobs submitted for a run or sweep (submitit's folders .submitit/<id>[_<task>])."""
    return sorted({p.name.partition("_")[0] for p in run_dir.glob(".submitit/*") if p.is_dir()})


def _cleanup(cluster, *run_dirs: Path) -> None:
    """Test cleanup, also after a failure: cancel these runs' jobs, kill what is left of them."""
    env = env_with(**_env(cluster))
    for run_dir in run_dirs:
        if jobs := _job_ids(run_dir):
            subprocess.run(["scancel", *jobs], env=env, capture_output=True, timeout=30)
        kill_leftovers(run_dir)


def _no_jobs_then_no_survivors(cluster, run_dir: Path) -> None:
    """No SLURM job of this run is listed any more and no process of it is left."""
    deadline, env, jobs = time.monotonic() + 120, env_with(**_env(cluster)), _job_ids(run_dir)
    assert jobs, f"no SLURM job was submitted for {run_dir}"
    while subprocess.run(
        ["squeue", "-h", "-o", "%i", "-j", ",".join(jobs)], capture_output=True, text=True, env=env
    ).stdout.strip():
        assert time.monotonic() < deadline, f"SLURM jobs {jobs} still listed 2 minutes after the submitter returned"
        time.sleep(0.2)
    assert_no_survivors(run_dir, grace=30)


def _result_written(run_dir: Path, job: str) -> float:
    """When the submitit result of SLURM job `job` was written (wall clock)."""
    (result,) = list(run_dir.glob(f".submitit/{job}/*_result.pkl"))
    return result.stat().st_mtime


def test_ctrl_c_stops_a_two_node_job_while_a_sweep_of_two_node_jobs_ends_with_its_table_and_report(cluster, tmp_path):
    """Side by side: a 2-node job stopped by Ctrl-C on its submitter, and a sweep of two 2-node
    jobs (one runs beside the stopped job, the other in its place once it has gone)."""
    stopped, stopped_log = tmp_path / "stopped", tmp_path / "stopped.log"
    sweep, log = tmp_path / "sweep", tmp_path / "log"
    sweeping = None
    try:
        proc = _submit(cluster, *TWO_NODES, "training.steps=100000", f"hydra.run.dir={stopped}", log=stopped_log)
        # The sweep is submitted once the stopped job is, so that one of its jobs runs beside it.
        wait_for(lambda: bool(_job_ids(stopped)), proc=proc, timeout=300, what="the stopped job's submission")
        sweeping = _submit(
            cluster, "-m", *TWO_NODES, "training.steps=3", "training.seed=1,2", f"hydra.sweep.dir={sweep}", log=log
        )
        # Ctrl-C on a submitter while its 2-node job trains: both nodes stop, `interrupted`.
        wait_for(lambda: metric_rows(stopped) >= 2, proc=proc, timeout=300, what="two training steps")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130, stopped_log.read_text()[-3000:]
        wait_for(lambda: (stopped / "summary.json").is_file(), timeout=60, what="the stopped job's summary")
        _no_jobs_then_no_survivors(cluster, stopped)
        s = read_summary(stopped)
        assert s["status"] == "interrupted" and s["error"].startswith("stopped by SIGTERM") and s["nnodes"] == 2

        # The sweep: a job array of two 2-node jobs, its end table and report.
        code, _ = _finish(sweeping, sweep, log)
        out = log.read_text()
        assert code == 0, out[-3000:]
        assert "qwen3exp sweep finished" in out and "2 completed" in out
        assert (sweep / "report.md").is_file() and (sweep / "report.csv").is_file()
        summaries = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/summary.json"))]
        assert [(s["status"], s["nnodes"], s["world_size"]) for s in summaries] == [("completed", 2, 2)] * 2
        _no_jobs_then_no_survivors(cluster, sweep)
    finally:
        if sweeping is not None and sweeping.poll() is None:
            sweeping.kill()
        _cleanup(cluster, stopped, sweep)


def test_a_time_limited_job_requeues_and_resumes_while_a_killed_node_fails_another(cluster, tmp_path, reference_losses):
    """Two jobs side by side: one with a short time limit (mostly waiting for its pre-timeout
    signal), and one whose second-node agent is killed, then relaunched."""
    limited, limited_log = tmp_path / "limited", tmp_path / "limited.log"
    run, log = tmp_path / "run", tmp_path / "log"
    # Time limit 3 min, pre-timeout signal 90 s before it. The ranks wait at step 3 until it comes
    # (a test hook): the first attempt ends at step 3 (earlier only if the signal comes first: on a
    # slow machine the ranks may still be before step 3 after 90 s).
    limited_args = (
        *TWO_NODES,
        "launcher.time_limit_min=3",
        "launcher.signal_delay_s=90",
        "launcher.requeue=true",
        "checkpoint=dcp",
        "checkpoint.interval=100",
        f"hydra.run.dir={limited}",
    )
    args = (*TWO_NODES, "checkpoint=dcp", "checkpoint.interval=2", f"hydra.run.dir={run}")
    try:
        # SLURM holds a requeued job about 2 minutes (BeginTime, 144 s measured on 22.05); the
        # launcher lets its own job start again KillWait + 5 s after the requeue (launchers/slurm.py).
        requeued = _Returned(_submit(cluster, *limited_args, log=limited_log, QWEN3EXP_FAULT_STALL_AT_STEP="3"))

        # A killed second-node agent: the job fails fast on both nodes, the summary names node 1.
        proc = _submit(cluster, *args, log=log, QWEN3EXP_FAULT_HANG_AT_STEP="4")
        wait_for(
            lambda: (run / "checkpoint" / "step-2" / ".metadata").is_file() and metric_rows(run) >= 3,
            proc=proc,
            timeout=300,
            what="steps 1-3 and checkpoint step 2",
        )
        agent = json.loads((run / "logs" / "agent_node1.json").read_text())
        killed = time.monotonic()
        os.kill(agent["pid"], signal.SIGKILL)  # node 1's torchrun agent (its namespace, our pid namespace)
        code, returned = _finish(proc, run, log)
        print(f"the submitter returned {returned - killed:.1f} s after node 1's agent was killed")
        assert code == 137, log.read_text()[-3000:]  # srun's: a task killed by SIGKILL
        assert returned - killed < 30
        s = read_summary(run)
        assert s["status"] == "failed" and s["steps_completed"] == 3
        node1 = f"node 1 ({cluster['nodes'][1]})"
        assert s["error"].startswith(f"{node1}: its torchrun agent (pid {agent['pid']}) was killed"), s["error"]
        _no_jobs_then_no_survivors(cluster, run)
        # ... and a relaunch (the same command, no fault) resumes from the latest checkpoint. It is
        # also the plain 2-node run: its submitter returns at once after the job's end, and the run
        # trains bit for bit like 1 node x 2 ranks.
        failed_jobs = _job_ids(run)
        relaunch_log = tmp_path / "relaunch.log"
        proc = _submit(cluster, *args, log=relaunch_log)
        code, _ = _finish(proc, run, relaunch_log)
        returned = time.time()
        assert code == 0, relaunch_log.read_text()[-3000:]
        (job,) = set(_job_ids(run)) - set(failed_jobs)
        latency = returned - _result_written(run, job)
        print(f"submitter returned {latency:.1f} s after the job's result was written")
        assert latency < 30, f"the submitter returned {latency:.1f} s after the job ended"
        s = read_summary(run)
        assert s["status"] == "completed" and s["resumed_from_step"] == 2
        assert [a["status"] for a in s["attempts"]] == ["failed", "completed"]
        assert (s["status"], s["world_size"], s["nnodes"], s["steps_completed"]) == ("completed", 2, 2, 6)
        # One torchrun agent per node, each in its own namespace (its own hostname).
        agents = [json.loads((run / "logs" / f"agent_node{n}.json").read_text()) for n in (0, 1)]
        assert [a["host"] for a in agents] == cluster["nodes"] and all(a["how"] == "done" for a in agents)
        command = (run / "command.txt").read_text()
        assert command.startswith("srun --nodes=2 --ntasks-per-node=1 ")
        # node 0's binding, like the local launcher's (each other node's agent sets is_host=false)
        assert f"--local-addr {cluster['nodes'][0]} " in command and ",is_host=true " in command
        script = next(run.glob(f".submitit/{job}/*_submission.sh")).read_text()
        assert "#SBATCH --nodes=2" in script and "#SBATCH --signal=USR2@120" in script
        assert [row["loss"] for row in read_metrics(run)] == reference_losses  # bit for bit
        _no_jobs_then_no_survivors(cluster, run)

        # The time-limited job: checkpointed at the signal, requeued (the same job), resumed.
        code, _ = requeued.result(limited, limited_log)
        assert code == 0, limited_log.read_text()[-3000:]
        s = read_summary(limited)
        first, *_, last = s["attempts"]
        step = first["steps_completed"]
        print(f"the time-limited job stopped after step {step} and was requeued; attempts {s['attempts']}")
        assert first["status"] == "requeued" and 1 <= step <= 3, s["attempts"]
        assert "time limit" in first["error"] and f"checkpoint step-{step} saved" in first["error"]
        assert s["status"] == "completed" and last["status"] == "completed"
        assert s["attempts"][1]["resumed_from_step"] == step
        # Requeued to start KillWait (5 s here) + 5 s after the requeue, SLURM's main scheduling loop
        # starts it (every 5 s in this cluster: tests/slurm/twonode.sh; 60 s by default, which gave a
        # 53 s gap); SLURM's own hold is 121 s (launchers/slurm.py requeue_this_job).
        gap = s["attempts"][1]["started"] - first["started"] - first["wall_seconds"]
        print(f"the requeued attempt started {gap:.0f} s after the first one ended")
        assert gap < 90, s["attempts"]
        assert len({a["job_id"] for a in s["attempts"]}) == 1  # the same job, requeued
        assert [row["loss"] for row in read_metrics(limited)] == reference_losses  # like an uninterrupted run
        _no_jobs_then_no_survivors(cluster, limited)
    finally:
        _cleanup(cluster, run, limited)


def _in_netns(cluster, node: int, *args: str, log: Path, own_hostname: bool = True, **env) -> subprocess.Popen:
    """`python -m qwen3exp ARGS` inside node `node`'s network namespace; with `own_hostname`, under
    the node's hostname (which /etc/hosts resolves to its address, as on a real machine), else
    under this machine's, which resolves to no address of the namespace."""
    import sys

    prefix = (
        ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', cluster["nodes"][node]] if own_hostname else []
    )
    return subprocess.Popen(
        ["nsenter", f"--net=/var/run/netns/{cluster['netns'][node]}", *prefix, sys.executable, "-m", "qwen3exp", *args],
        cwd=REPO,
        env=env_with(**env),
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )


def test_the_local_launcher_across_two_namespaces_and_an_unreachable_rendezvous(cluster, tmp_path, reference_losses):
    """The local launcher, one node per namespace; node 0 under this machine's hostname, which does
    not resolve to the endpoint's (node 0's) address: node 0 hosts the c10d store and the ranks'
    store all the same (torchrun alone would host neither, and the launch hung). Side by side, a
    node 1 whose endpoint nobody serves fails within launcher.rdzv_timeout_s naming it."""
    run, lone = tmp_path / "run", tmp_path / "lone"
    endpoint = f"{cluster['addrs'][0]}:{free_port()}"
    nowhere = f"{cluster['addrs'][0]}:{free_port()}"  # node 0's address, nothing listens there
    common = (
        *TINY,
        "launcher.nnodes=2",
        "launcher.nproc_per_node=1",
        f"launcher.rdzv_endpoint={endpoint}",
        f"hydra.run.dir={run}",
    )
    try:
        started = time.monotonic()
        unreachable = _in_netns(
            cluster,
            1,
            *TINY,
            "launcher.nnodes=2",
            "launcher.nproc_per_node=1",
            "launcher.node_rank=1",
            f"launcher.rdzv_endpoint={nowhere}",
            "launcher.rdzv_timeout_s=5",
            f"hydra.run.dir={lone}",
            log=tmp_path / "lone.log",
        )
        node0 = _in_netns(cluster, 0, *common, "launcher.node_rank=0", log=tmp_path / "node0.log", own_hostname=False)
        wait_for(lambda: (run / "experiment.yaml").is_file(), proc=node0, what="node 0's run files")
        node1 = _in_netns(cluster, 1, *common, "launcher.node_rank=1", log=tmp_path / "node1.log")

        code = unreachable.wait(timeout=120)
        seconds = time.monotonic() - started
        out = (tmp_path / "lone.log").read_text()
        assert code == 1, out[-3000:]
        s = json.loads((lone / "summary_node1.json").read_text())
        a = json.loads((lone / "logs" / "agent_node1.json").read_text())
        waited = a["ended"] - a["started"]
        print(f"the unreachable rendezvous failed after {seconds:.1f} s (its agent waited {waited:.1f} s)")
        assert waited < 5 + 25 and seconds < 90, f"took {seconds:.0f} s, its agent {waited:.0f} s"
        assert s["status"] == "failed"
        assert f"the c10d rendezvous at {nowhere} did not complete within launcher.rdzv_timeout_s=5 s" in s["error"]
        assert nowhere in out and "Traceback" not in out.split("qwen3exp: failed")[-1]
        assert_no_survivors(lone)

        codes = [node0.wait(timeout=600), node1.wait(timeout=600)]
        logs = [(tmp_path / f"node{n}.log").read_text()[-2000:] for n in (0, 1)]
        assert codes == [0, 0], "\n".join(logs)
        agents = [json.loads((run / "logs" / f"agent_node{n}.json").read_text()) for n in (0, 1)]
        assert agents[0]["rdzv_endpoint"] == agents[1]["rdzv_endpoint"] == endpoint
        command = (run / "command.txt").read_text()
        assert f"--local-addr {cluster['addrs'][0]} " in command and ",is_host=true " in command
        assert [row["loss"] for row in read_metrics(run)] == reference_losses
        assert_no_survivors(run)
    finally:
        kill_leftovers(run)
        kill_leftovers(lone)

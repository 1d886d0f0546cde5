"""Scale-out configuration without training: per-node commands in the dry run, the SLURM launcher's
Hydra overrides and sbatch options, placement inside a SLURM job, configuration errors (exit 2,
no traceback), the fault-injection hook's parsing, and the process-supervision primitives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import compose
from qwen3exp.cli import main
from qwen3exp.config.schema import validate_experiment
from qwen3exp.errors import ConfigError
from qwen3exp.launchers import slurm
from qwen3exp.plan import placement, slurm_nodes
from qwen3exp.run import faults, procs

TWO_NODES = ("launcher.nnodes=2", "launcher.nproc_per_node=1", "launcher.rdzv_endpoint=10.0.0.1:29400")


def _dry(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["dry_run=true", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_dry_run_shows_the_per_node_command(capsys):
    code, out, _ = _dry(capsys, *TWO_NODES, "launcher.node_rank=1")
    assert code == 0
    assert "launch:     this is node 1 of 2 (launcher.node_rank); c10d rendezvous at 10.0.0.1:29400" in out
    assert "launcher.node_rank=0..1" in out  # what to run on the other nodes
    for node in (0, 1):
        command = next(line for line in out.splitlines() if line.startswith(f"node {node}:"))
        assert "--nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 10.0.0.1:29400" in command
        assert f"--node-rank {node} " in command
        # node 0 hosts the c10d store whatever its hostname resolves to; the others connect to it
        assert f"--rdzv-conf join_timeout=300,read_timeout=300,is_host={'true' if node == 0 else 'false'} " in command
        assert ("--local-addr 10.0.0.1 " in command) == (node == 0)  # the ranks' store: node 0's address


def test_node_rank_comes_from_slurm_nodeid(capsys, monkeypatch):
    monkeypatch.setenv("SLURM_NODEID", "1")
    code, out, _ = _dry(capsys, *TWO_NODES)
    assert code == 0 and "this is node 1 of 2 (SLURM_NODEID from the environment)" in out


@pytest.mark.parametrize(
    "args, key, says",
    [
        (("launcher.nnodes=2",), "launcher.rdzv_endpoint", "needs a rendezvous endpoint"),
        # A dry run shows every node's command without it; a real launch needs this node's rank.
        (("dry_run=false", *TWO_NODES), "launcher.node_rank", "SLURM_NODEID is not set"),
        ((*TWO_NODES, "launcher.node_rank=2"), "launcher.node_rank", "must be below nnodes"),
        (("launcher.rdzv_endpoint=node0",), "launcher.rdzv_endpoint", "not a host:port"),
        (("launcher=slurm", "launcher.nnodes=2", "launcher.srun=false"), "launcher.srun", "needs srun"),
    ],
)
def test_scale_out_mistakes_exit_2(capsys, monkeypatch, args, key, says):
    monkeypatch.delenv("SLURM_NODEID", raising=False)
    code, _, err = _dry(capsys, *args)
    assert code == 2 and key in err and says in err and "Traceback" not in err


def test_a_sweep_over_slurm_resources_is_refused(capsys):
    code = main(["-m", "dry_run=true", "launcher=slurm", "launcher.partition=a,b"])
    err = capsys.readouterr().err
    assert code == 2 and "one set of SLURM resources" in err


def test_slurm_dry_run_shows_sbatch_and_srun(capsys):
    code, out, _ = _dry(
        capsys,
        "launcher=slurm",
        "launcher.nnodes=2",
        "launcher.partition=trn2",
        "launcher.cpus_per_node=192",
        "launcher.time_limit_min=30",
        "launcher.account=ml",
        "+launcher.additional_parameters.exclusive=true",
    )
    assert code == 0
    assert (
        "launch:     sbatch --nodes=2 --ntasks-per-node=1 --time=30 --cpus-per-task=192 --partition=trn2 "
        "--account=ml --exclusive through hydra-submitit-launcher"
    ) in out
    assert "command:    srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=192 --kill-on-bad-exit=1 " in out
    assert "--rdzv-endpoint '<first node>:<free port>'" in out


def test_slurm_launcher_section_reaches_hydra_submitit_launcher(tmp_path):
    """qwen3exp's launcher sets hydra-submitit-launcher's SlurmLauncher up from the validated
    launcher section: the executor gets exactly those values."""
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher

    exp = validate_experiment(
        compose(
            "launcher=slurm",
            "launcher.nnodes=4",
            "launcher.partition=trn2",
            "launcher.cpus_per_node=96",
            "launcher.time_limit_min=90",
            "+launcher.additional_parameters.exclusive=true",
            "launcher.setup=[module load neuron]",
        )
    )
    params = slurm.submitit_params(exp, tmp_path)
    hl = SlurmLauncher(**params).params  # what submitit's executor is updated with
    # submitit is told one node and one task (it expects one result per task, and the job runs the
    # function once); sbatch gets --nodes=4 through additional_parameters (the upstream-bug
    # workaround in qwen3exp.launchers.slurm.submitit_params).
    assert (hl["nodes"], hl["tasks_per_node"], hl["cpus_per_task"], hl["partition"], hl["timeout_min"]) == (
        1,
        1,
        96,
        "trn2",
        90,
    )
    assert hl["use_srun"] is False and hl["additional_parameters"] == {"nodes": 4, "exclusive": True}
    assert hl["setup"] == ["module load neuron"] and hl["account"] is None and hl["name"] == "tiny_native"
    assert hl["submitit_folder"] == f"{tmp_path}/.submitit/%j"


def _slurm_exp(*args):
    return validate_experiment(compose("launcher=slurm", "platform=cpu", *args))


def test_placement_inside_a_slurm_job(monkeypatch):
    exp = _slurm_exp("launcher.nnodes=2")
    monkeypatch.setattr(slurm_nodes, "hostnames", lambda nodelist: {"trn[07-08]": ["trn07", "trn08"]}[nodelist])
    where = placement.resolve(
        exp,
        {"SLURM_JOB_ID": "812", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "trn[07-08]"},
    )
    assert where.rdzv_endpoint.startswith("trn07:") and where.rdzv_id == "812"
    assert where.agent_prefix[:3] == ("srun", "--nodes=2", "--ntasks-per-node=1")
    one = placement.resolve(_slurm_exp(), {"SLURM_JOB_ID": "813", "SLURM_JOB_NUM_NODES": "1"})
    assert one.agent_prefix == () and one.standalone  # one node: torchrun directly
    with pytest.raises(ConfigError, match="has 1 node"):
        placement.resolve(exp, {"SLURM_JOB_ID": "814", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "trn07"})


def test_fault_hook_reads_its_environment():
    assert faults.from_env({}) == faults.Faults()
    f = faults.from_env({faults.RAISE_AT_STEP: "3", faults.RANK: "1"})
    assert (f.raise_at_step, f.hang_at_step, f.rank) == (3, None, 1)
    with pytest.raises(ValueError, match="QWEN3EXP_FAULT_HANG_AT_STEP='soon'"):
        faults.from_env({faults.HANG_AT_STEP: "soon"})

    class Trainer:
        step = 0

        def train_step(self, batch):
            return batch

    t = Trainer()
    faults.install(t, f, rank=0)  # another rank: untouched
    t.step = 3
    assert t.train_step("b") == "b"
    faults.install(t, f, rank=1)
    t.step = 2
    assert t.train_step("b") == "b"
    t.step = 3
    with pytest.raises(faults.InjectedFault, match="RAISE_AT_STEP=3 on rank 1"):
        t.train_step("b")


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_parent_death_signal_and_kill_tree(tmp_path):
    """A child that asked for a parent-death signal dies with its SIGKILLed parent; kill_tree finds
    processes that left the process group (new sessions), as torchrun's ranks do."""
    pidfile = tmp_path / "child.pid"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import os, signal, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c",
            "import os, signal, time\\n"
            "from qwen3exp.run import procs\\n"
            "procs.die_with_parent(signal.SIGKILL, {{ppid}})\\n"
            "open({str(pidfile)!r}, 'w').write(str(os.getpid()))\\n"
            "time.sleep(600)\\n".replace("{{ppid}}", str(os.getpid()))], start_new_session=True)
        time.sleep(600)
    """),
        ],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    deadline = time.monotonic() + 60
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = int(pidfile.read_text())
    assert child in procs.descendants(parent.pid)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the child outlived its SIGKILLed parent"

    # kill_tree: a grandchild in its own session, still found through the parent links.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
            "start_new_session=True)\ntime.sleep(600)",
        ]
    )
    deadline = time.monotonic() + 60
    while len(procs.descendants(holder.pid)) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grandchild = procs.descendants(holder.pid)[0]
    killed = procs.kill_tree(holder.pid)
    assert grandchild in killed
    holder.kill()
    holder.wait()
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)

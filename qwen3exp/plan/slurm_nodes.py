"""Where a SLURM job's ranks go (`launcher=slurm`): one torchrun on the first node, or srun with
one torchrun agent per node and a c10d rendezvous on the first node; and the sbatch options the
plan shows. Submitting and cancelling the jobs is `qwen3exp.launchers.slurm`."""

from __future__ import annotations

import functools
import socket
import subprocess
from collections.abc import Mapping

from qwen3exp.config.schema import Experiment, SlurmLauncher
from qwen3exp.errors import ConfigError, Problem
from qwen3exp.plan.placement import STANDALONE_ENDPOINT, STANDALONE_ID, Placement


def sbatch_flags(la: SlurmLauncher) -> list[str]:
    """The sbatch options the job is submitted with (for the plan)."""
    flags = [f"--nodes={la.nnodes}", "--ntasks-per-node=1", f"--time={la.time_limit_min}"]
    for flag, value in (("cpus-per-task", la.cpus_per_node), ("mem", f"{la.mem_gb}GB" if la.mem_gb else None),
                        ("gpus-per-node", la.gpus_per_node), ("partition", la.partition),
                        ("account", la.account)):
        if value is not None:
            flags.append(f"--{flag}={value}")
    for key, value in la.additional_parameters.items():
        flags.append(f"--{key.replace('_', '-')}" + ("" if value is True else f"={value}"))
    return flags


def uses_srun(la: SlurmLauncher) -> bool:
    return la.srun if la.srun is not None else la.nnodes > 1


def srun_prefix(la: SlurmLauncher) -> tuple[str, ...]:
    # Since SLURM 22.05 srun no longer inherits --cpus-per-task from the job: pass it again.
    cpus = (f"--cpus-per-task={la.cpus_per_node}",) if la.cpus_per_node else ()
    return ("srun", f"--nodes={la.nnodes}", "--ntasks-per-node=1", *cpus, "--kill-on-bad-exit=1")


def placement(exp: Experiment, la: SlurmLauncher, env: Mapping[str, str]) -> Placement:
    prefix = srun_prefix(la) if uses_srun(la) else ()
    if "SLURM_JOB_ID" not in env:  # planning on the submit host: decided in the job
        if not prefix:
            return Placement(1, 0, STANDALONE_ENDPOINT, STANDALONE_ID, "torchrun on the one node")
        return Placement(la.nnodes, 0, "<first node>:<free port>", "<SLURM job id>",
                         "srun starts one torchrun agent per node, c10d rendezvous on the first node",
                         agent_prefix=prefix)
    nodes = int(env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", "1")))
    if nodes != la.nnodes:
        raise ConfigError([Problem("launcher.nnodes", la.nnodes,
                                   f"the SLURM job {env['SLURM_JOB_ID']} has {nodes} node(s)",
                                   str(nodes), "submit with launcher=slurm, or set launcher.nnodes to the allocation")])
    node_rank = int(env.get("SLURM_NODEID", "0"))
    if not prefix:
        return Placement(1, node_rank, STANDALONE_ENDPOINT, STANDALONE_ID, "SLURM job, one node")
    first = hostnames(env["SLURM_JOB_NODELIST"])[0]
    return Placement(la.nnodes, node_rank, f"{first}:{job_port(env['SLURM_JOB_ID'])}", env["SLURM_JOB_ID"],
                     f"SLURM job {env['SLURM_JOB_ID']}: srun, rendezvous on {first}", agent_prefix=prefix)


def hostnames(nodelist: str) -> list[str]:
    """SLURM's compressed node list (node[01-04],gpu7) expanded by SLURM itself."""
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()


@functools.cache
def job_port(job_id: str) -> int:
    """The rendezvous port of this job: a free TCP port of this host (the first node, where the
    rendezvous store runs), chosen once, so the plan and the command agree."""
    return free_port()


def free_port() -> int:
    """A free TCP port on this host."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]

"""Where a SLURM job's ranks go (`launcher=slurm`): one torchrun on the first node, or srun with
one torchrun agent per node and a c10d rendezvous on the first node; the sbatch options and the
time limit the plan shows; the time limit seen from inside the job (its deadline, and what an
attempt stopped at it becomes). Submitting, cancelling and requeueing the jobs is
`qwen3exp.launchers.slurm`."""

from __future__ import annotations

import datetime
import functools
import socket
import subprocess
from collections.abc import Mapping

from qwen3exp.config.schema import Experiment
from qwen3exp.config.sections.launcher import SlurmLauncher
from qwen3exp.errors import ConfigError, Problem
from qwen3exp.plan.nodes import STANDALONE_ENDPOINT, STANDALONE_ID, Placement
from qwen3exp.run import timelimit

ATTEMPT_ENV = "SLURM_RESTART_COUNT"
"""Set by SLURM in a requeued job: how many times it was requeued (restarted) so far."""


class SlurmNodes:
    """`Nodes` of `SlurmLauncher`."""

    def placement(self, exp: Experiment, env: Mapping[str, str]) -> Placement:
        return placement(exp, _section(exp), env)

    def notes(self, exp: Experiment, where: Placement) -> list[str]:
        la = _section(exp)
        return [
            f"sbatch {' '.join(sbatch_flags(la))} through hydra-submitit-launcher (a sweep: a job "
            f"array); the job runs on its first node and then: {where.how}",
            time_limit_note(exp, la),
        ]

    def time_limit_deadline(self, exp: Experiment, env: Mapping[str, str]) -> float | None:
        return time_limit_deadline(_section(exp), env)

    def time_limit_outcome(self, exp: Experiment, record: dict, env: Mapping[str, str]) -> tuple[str, int, str]:
        la, n = _section(exp), attempt(env)
        what = timelimit.stopped_at_limit(record, f", launcher.signal_delay_s={la.signal_delay_s} s before it")
        if not la.requeue:
            return timelimit.not_requeued(what, "launcher.requeue=false")
        if n <= la.max_requeues:
            return "requeued", 0, f"{what}; requeued (attempt {n} of at most {la.max_requeues + 1})"
        return timelimit.not_requeued(what, f"launcher.max_requeues={la.max_requeues} reached")


def _section(exp: Experiment) -> SlurmLauncher:
    assert isinstance(exp.launcher, SlurmLauncher)  # found by this class (qwen3exp.plan.placement)
    return exp.launcher


def sbatch_flags(la: SlurmLauncher) -> list[str]:
    """The sbatch options the job is submitted with (for the plan)."""
    # (submitit adds --signal=USR2@signal_delay_s, and --requeue with launcher.requeue: the plan's
    # time-limit line says so.)
    flags = [f"--nodes={la.nnodes}", "--ntasks-per-node=1", f"--time={la.time_limit_min}"]
    for flag, value in (
        ("cpus-per-task", la.cpus_per_node),
        ("mem", f"{la.mem_gb}GB" if la.mem_gb else None),
        ("gpus-per-node", la.gpus_per_node),
        ("partition", la.partition),
        ("account", la.account),
    ):
        if value is not None:
            flags.append(f"--{flag}={value}")
    for key, value in la.additional_parameters.items():
        flags.append(f"--{key.replace('_', '-')}" + ("" if value is True else f"={value}"))
    return flags


def uses_srun(la: SlurmLauncher) -> bool:
    # A job that requeues itself needs SLURM's pre-timeout signal, which reaches job steps only.
    return la.srun if la.srun is not None else (la.nnodes > 1 or la.requeue)


def time_limit_note(exp: Experiment, la: SlurmLauncher) -> str:
    """What happens at the time limit (for the plan)."""
    at = f"at the time limit ({la.time_limit_min} min; SIGUSR2 {la.signal_delay_s} s before it)"
    if not exp.checkpoint.resumable:
        return (
            f"{at} the job is stopped and cannot resume: checkpoint.save=false keeps no "
            "training state (checkpoint.save=true does, and launcher.requeue=true requeues the job)"
        )
    if la.requeue:
        return (
            f"{at} the ranks save a DCP checkpoint and the job requeues itself (at most "
            f"{la.max_requeues} times), resuming from it in the same run directory"
        )
    if not uses_srun(la):
        return (
            f"{at} the job is stopped (the signal reaches job steps only, and torchrun runs without srun "
            "here); the same command again resumes from the latest DCP checkpoint"
        )
    return (
        f"{at} the ranks save a DCP checkpoint and stop (launcher.requeue=false: not requeued); the same "
        "command again resumes from it"
    )


def requeue_problem(exp: Experiment, la: SlurmLauncher) -> Problem | None:
    if la.requeue and not exp.checkpoint.resumable:
        return Problem(
            "launcher.requeue",
            True,
            "a requeued job resumes from a DCP checkpoint, and checkpoint.save=false keeps none",
            "checkpoint.save=true (checkpoint=dcp), or launcher.requeue=false",
        )
    return None


def srun_prefix(la: SlurmLauncher) -> tuple[str, ...]:
    # Since SLURM 22.05 srun no longer inherits --cpus-per-task from the job: pass it again.
    cpus = (f"--cpus-per-task={la.cpus_per_node}",) if la.cpus_per_node else ()
    return ("srun", f"--nodes={la.nnodes}", "--ntasks-per-node=1", *cpus, "--kill-on-bad-exit=1")


def placement(exp: Experiment, la: SlurmLauncher, env: Mapping[str, str]) -> Placement:
    if (problem := requeue_problem(exp, la)) is not None:
        raise ConfigError([problem])
    prefix = srun_prefix(la) if uses_srun(la) else ()
    if "SLURM_JOB_ID" not in env:  # planning on the submit host: decided in the job
        if not prefix:
            return Placement(1, 0, STANDALONE_ENDPOINT, STANDALONE_ID, "torchrun on the one node")
        return Placement(
            la.nnodes,
            0,
            "<first node>:<free port>",
            "<SLURM job id>",
            "srun starts one torchrun agent per node, c10d rendezvous on the first node",
            agent_prefix=prefix,
        )
    nodes = int(env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", "1")))
    if nodes != la.nnodes:
        raise ConfigError(
            [
                Problem(
                    "launcher.nnodes",
                    la.nnodes,
                    f"the SLURM job {env['SLURM_JOB_ID']} has {nodes} node(s)",
                    str(nodes),
                    "submit with launcher=slurm, or set launcher.nnodes to the allocation",
                )
            ]
        )
    node_rank = int(env.get("SLURM_NODEID", "0"))
    if not prefix:
        return Placement(1, node_rank, STANDALONE_ENDPOINT, STANDALONE_ID, "SLURM job, one node")
    first = hostnames(env["SLURM_JOB_NODELIST"])[0]
    return Placement(
        la.nnodes,
        node_rank,
        f"{first}:{job_port(env['SLURM_JOB_ID'])}",
        env["SLURM_JOB_ID"],
        f"SLURM job {env['SLURM_JOB_ID']}: srun, rendezvous on {first}",
        agent_prefix=prefix,
    )


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


def attempt(env: Mapping[str, str]) -> int:
    """This job's attempt, 1 for the first run, 2 after one requeue, ..."""
    value = env.get(ATTEMPT_ENV, "0")
    return int(value) + 1 if value.isdigit() else 1


def time_limit_deadline(la: SlurmLauncher, env: Mapping[str, str]) -> float | None:
    """In a SLURM job: when (time.time()) the pre-timeout checkpoint is due, from the job's EndTime
    (`squeue -o %e`) minus `launcher.signal_delay_s`. The launcher records the request itself then,
    should SLURM's own signal not have come: it never reaches the batch script's processes, and
    after a requeue SLURM 22.05 did not send it again (measured). None outside a job."""
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%e"], capture_output=True, text=True, timeout=30)
        end = datetime.datetime.fromisoformat(out.stdout.strip().splitlines()[0])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    return end.timestamp() - la.signal_delay_s

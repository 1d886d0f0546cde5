"""Where the torchrun agents sit: how many nodes, which one this launcher is on, the c10d
rendezvous, and what starts the agents (torchrun itself, or srun starting one agent per node).

Resolved from the validated launcher section and the scheduler's environment (SLURM_NODEID for a
local launcher started by srun; the job's node list inside a SLURM job, see `qwen3exp.launchers.slurm`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from qwen3exp.errors import ConfigError, Problem
from qwen3exp.config.schema import Experiment, LocalLauncher, SlurmLauncher

# One node and no endpoint: like torchrun --standalone (a free port on localhost) but with a fixed
# run id, so that the per-rank log paths are predictable.
STANDALONE_ENDPOINT = "localhost:0"
STANDALONE_ID = "qwen3exp"


@dataclass(frozen=True)
class Placement:
    nnodes: int
    node_rank: int
    """This launcher's node. Node 0 resets the metrics and writes summary.json."""
    rdzv_endpoint: str
    """host:port of the c10d rendezvous (torchrun's rank-assignment store)."""
    rdzv_id: str
    how: str
    """Where node_rank and the endpoint came from (for the plan)."""
    agent_prefix: tuple[str, ...] = ()
    """Command that starts one torchrun agent per node (srun ...); empty: torchrun runs here."""
    per_node_hint: str | None = None
    """For launchers started by hand on every node: what to change on the other nodes."""

    @property
    def standalone(self) -> bool:
        return self.rdzv_endpoint == STANDALONE_ENDPOINT


def resolve(exp: Experiment, env: Mapping[str, str]) -> Placement:
    match exp.launcher:
        case LocalLauncher() as la:
            return _local(exp, la, env)
        case SlurmLauncher() as la:
            from qwen3exp.launchers import slurm
            return slurm.placement(exp, la, env)
    raise AssertionError(exp.launcher)


def _local(exp: Experiment, la: LocalLauncher, env: Mapping[str, str]) -> Placement:
    if la.node_rank is not None:
        node_rank, how = la.node_rank, "launcher.node_rank"
    elif la.nnodes == 1:
        node_rank, how = 0, "one node"
    elif "SLURM_NODEID" in env:
        node_rank, how = int(env["SLURM_NODEID"]), "SLURM_NODEID from the environment"
    elif exp.dry_run:  # planning: every node's command is shown; a real launch needs the rank
        node_rank, how = 0, "launcher.node_rank not set: required when the run starts"
    else:
        raise ConfigError([Problem("launcher.node_rank", None,
                                   f"nnodes={la.nnodes} needs this node's rank and SLURM_NODEID is not set",
                                   f"0..{la.nnodes - 1}",
                                   "set launcher.node_rank=... on each node, or start the launchers with srun")])
    if node_rank >= la.nnodes:
        raise ConfigError([Problem("launcher.node_rank", node_rank, f"({how}) must be below nnodes ({la.nnodes})",
                                   f"0..{la.nnodes - 1}")])
    if la.nnodes == 1 and not la.rdzv_endpoint:
        return Placement(1, 0, STANDALONE_ENDPOINT, STANDALONE_ID, how)
    hint = (f"start the same command on each of the {la.nnodes} nodes with launcher.node_rank=0..{la.nnodes - 1} "
            f"(same rdzv_endpoint and, on a shared file system, the same hydra.run.dir)") if la.nnodes > 1 else None
    return Placement(la.nnodes, node_rank, la.rdzv_endpoint, exp.name, how, per_node_hint=hint)


def notes(exp: Experiment, where: Placement) -> list[str]:
    """For the plan: how the agents' commands are started."""
    match exp.launcher:
        case SlurmLauncher() as la:
            from qwen3exp.launchers import slurm
            return [f"sbatch {' '.join(slurm.sbatch_flags(la))} through hydra-submitit-launcher (a sweep: a job "
                    f"array); the job runs on its first node and then: {where.how}"]
        case LocalLauncher() if where.nnodes > 1:
            return [f"this is node {where.node_rank} of {where.nnodes} ({where.how}); c10d rendezvous at "
                    f"{where.rdzv_endpoint}", f"other nodes: {where.per_node_hint}"]
    return []

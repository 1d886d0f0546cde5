"""Where the torchrun agents sit: how many nodes, which one this launcher is on, the c10d
rendezvous, and what starts the agents (torchrun itself, or srun starting one agent per node).

Resolved from the validated launcher section and the scheduler's environment (SLURM_NODEID for a
local launcher started by srun; the job's node list inside a SLURM job, see `qwen3exp.launchers.slurm`).
`torchrun_commands` / `torchrun_argv` build the agents' commands from it (the plan records them; the
launcher runs its node's one).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from qwen3exp.config.schema import Experiment, LocalLauncher, SlurmLauncher
from qwen3exp.errors import ConfigError, Problem

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
            from qwen3exp.plan import slurm_nodes as slurm
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
    assert la.rdzv_endpoint is not None  # the schema requires one for nnodes > 1
    return Placement(la.nnodes, node_rank, la.rdzv_endpoint, exp.name, how, per_node_hint=hint)


def notes(exp: Experiment, where: Placement) -> list[str]:
    """For the plan: how the agents' commands are started."""
    match exp.launcher:
        case SlurmLauncher() as la:
            from qwen3exp.plan import slurm_nodes as slurm
            return [f"sbatch {' '.join(slurm.sbatch_flags(la))} through hydra-submitit-launcher (a sweep: a job "
                    f"array); the job runs on its first node and then: {where.how}", slurm.time_limit_note(exp, la)]
        case LocalLauncher() if where.nnodes > 1:
            return [f"this is node {where.node_rank} of {where.nnodes} ({where.how}); c10d rendezvous at "
                    f"{where.rdzv_endpoint}", f"other nodes: {where.per_node_hint}"]
    return []


# --------------------------------------------------------------------------- torchrun commands
def torchrun_commands(exp: Experiment, where: Placement, *, nnodes: int, nproc_per_node: int,
                      run_dir: Path) -> list[list[str]]:
    """The command of every node's torchrun agent: one per node rank when a launcher runs on each
    node; one (srun starting them all) in a SLURM job. `nnodes` / `nproc_per_node`: the mesh's."""
    if nnodes == 1 or where.agent_prefix:
        return [torchrun_argv(exp, where, nnodes=nnodes, nproc_per_node=nproc_per_node, run_dir=run_dir)]
    return [torchrun_argv(exp, where, nnodes=nnodes, nproc_per_node=nproc_per_node, run_dir=run_dir, node_rank=r)
            for r in range(nnodes)]


def torchrun_argv(exp: Experiment, where: Placement, *, nnodes: int, nproc_per_node: int, run_dir: Path,
                  node_rank: int | None = None) -> list[str]:
    """The command that starts one node's torchrun agent (default: this launcher's node; with srun:
    every node's agent)."""
    from qwen3exp.run import rundir

    run_dir = Path(run_dir)
    # qwen3exp.run.agent is torchrun's own main plus a record of how each failed rank died (a rank
    # killed by a signal writes nothing itself): see qwen3exp.run.agent.root_cause.
    argv = [*where.agent_prefix, sys.executable, "-m", "qwen3exp.run.agent",
            "--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", where.rdzv_endpoint, "--rdzv-id", where.rdzv_id]
    if nnodes > 1:
        # Bounded: connecting to the endpoint (read_timeout) and waiting for every node (join_timeout).
        t = exp.launcher.rdzv_timeout_s
        conf = f"join_timeout={t},read_timeout={t}"
        # Node 0 hosts the c10d store, the others connect to it. torchrun would otherwise guess by
        # matching the endpoint against this machine's hostname, and on a host whose hostname does
        # not resolve to the endpoint's address no node would host it (every agent waits for a
        # store nobody serves). rdzv_endpoint is node 0's address. With srun one command starts
        # every node's agent: it is node 0's, and qwen3exp.run.agent.for_this_node makes it the
        # other nodes' there (SLURM_NODEID), so a SLURM job binds like a launcher per node.
        this = 0 if where.agent_prefix else (where.node_rank if node_rank is None else node_rank)
        conf += f",is_host={'true' if this == 0 else 'false'}"
        if this == 0:
            # The ranks' own store (MASTER_ADDR) is on node 0 too: torchrun would name it by
            # this machine's hostname; the endpoint's host is what the other nodes reach.
            argv += ["--local-addr", where.rdzv_endpoint.rpartition(":")[0].strip("[]")]
        argv += ["--rdzv-conf", conf]
    if nnodes > 1 and not where.agent_prefix:
        # For the record only (which node's agent this is): c10d assigns the ranks itself, and
        # torchrun says so in a warning.
        argv += ["--node-rank", str(where.node_rank if node_rank is None else node_rank)]
    argv += ["--max-restarts", str(exp.launcher.max_restarts),
             "--log-dir", str(run_dir / rundir.LOGS), "--tee", "3", "--local-ranks-filter", "0",
             "-m", "qwen3exp.worker.main", str(run_dir)]
    return argv

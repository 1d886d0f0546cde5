"""This node's placement and the torchrun agents' commands.

`resolve` asks the launcher's own `Nodes` (`qwen3exp.plan.nodes`), found by the class of the
validated launcher section in `NODES` (one line per launcher: `local_nodes`, `slurm_nodes`), where
the agents sit; `notes` what the plan says of it. `torchrun_commands` / `torchrun_argv` build the
agents' commands from it (the plan records them; the launcher runs its node's one).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from qwen3exp.config.schema import Experiment
from qwen3exp.config.sections.launcher import LocalLauncher, SlurmLauncher
from qwen3exp.plan.local_nodes import LocalNodes
from qwen3exp.plan.nodes import Nodes, Placement
from qwen3exp.plan.slurm_nodes import SlurmNodes
from qwen3exp.run import rundir

NODES: dict[type, Nodes] = {
    LocalLauncher: LocalNodes(),
    SlurmLauncher: SlurmNodes(),
}
"""Each launcher section's `Nodes`, by the section's class (the schema's launcher union)."""


def nodes_of(section: object) -> Nodes:
    """The `Nodes` of a validated launcher section."""
    return NODES[type(section)]


def resolve(exp: Experiment, env: Mapping[str, str]) -> Placement:
    return nodes_of(exp.launcher).placement(exp, env)


def notes(exp: Experiment, where: Placement) -> list[str]:
    """For the plan: how the agents' commands are started."""
    return nodes_of(exp.launcher).notes(exp, where)


# --------------------------------------------------------------------------- torchrun commands
def torchrun_commands(
    exp: Experiment, where: Placement, *, nnodes: int, nproc_per_node: int, run_dir: Path, forked: bool = False
) -> list[list[str]]:
    """The command of every node's torchrun agent: one per node rank when a launcher runs on each
    node; one (srun starting them all) in a SLURM job. `nnodes` / `nproc_per_node`: the mesh's;
    `forked`: the platform's `forked_ranks`."""
    ranks: list[int | None] = [None] if nnodes == 1 or where.agent_prefix else list(range(nnodes))
    return [
        torchrun_argv(
            exp, where, nnodes=nnodes, nproc_per_node=nproc_per_node, run_dir=run_dir, node_rank=r, forked=forked
        )
        for r in ranks
    ]


def torchrun_argv(
    exp: Experiment,
    where: Placement,
    *,
    nnodes: int,
    nproc_per_node: int,
    run_dir: Path,
    node_rank: int | None = None,
    forked: bool = False,
) -> list[str]:
    """The command that starts one node's torchrun agent (default: this launcher's node; with srun:
    every node's agent). `forked`: the agent forks its ranks (`--start-method fork`, honoured by
    qwen3exp.run.agent for the worker; torchrun itself ignores it for a module)."""
    run_dir = Path(run_dir)
    # qwen3exp.run.agent is torchrun's own main plus a record of how each failed rank died (a rank
    # killed by a signal writes nothing itself): see qwen3exp.run.agent.root_cause.
    argv = [
        *where.agent_prefix,
        sys.executable,
        "-m",
        "qwen3exp.run.agent",
        "--nnodes",
        str(nnodes),
        "--nproc-per-node",
        str(nproc_per_node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        where.rdzv_endpoint,
        "--rdzv-id",
        where.rdzv_id,
    ]
    argv += _node_args(exp, where, nnodes=nnodes, node_rank=node_rank)
    argv += [
        "--max-restarts",
        str(exp.launcher.max_restarts),
        "--log-dir",
        str(run_dir / rundir.LOGS),
        "--tee",
        "3",
        "--local-ranks-filter",
        "0",
        *(["--start-method", "fork"] if forked else []),
        "-m",
        "qwen3exp.worker.main",
        str(run_dir),
    ]
    return argv


def _node_args(exp: Experiment, where: Placement, *, nnodes: int, node_rank: int | None) -> list[str]:
    """The rendezvous arguments of one node's agent when there are several nodes."""
    if nnodes == 1:
        return []
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
    argv = []
    if this == 0:
        # The ranks' own store (MASTER_ADDR) is on node 0 too: torchrun would name it by
        # this machine's hostname; the endpoint's host is what the other nodes reach.
        argv += ["--local-addr", where.rdzv_endpoint.rpartition(":")[0].strip("[]")]
    argv += ["--rdzv-conf", conf]
    if not where.agent_prefix:
        # For the record only (which node's agent this is): c10d assigns the ranks itself, and
        # torchrun says so in a warning.
        argv += ["--node-rank", str(where.node_rank if node_rank is None else node_rank)]
    return argv

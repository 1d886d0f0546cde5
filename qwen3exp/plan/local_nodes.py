"""Where a local launcher's ranks go (`launcher=local`): torchrun on this machine; with nnodes > 1
one launcher per node (started by hand with launcher.node_rank, or by srun: SLURM_NODEID) and a
c10d rendezvous at launcher.rdzv_endpoint. Running the launch is `qwen3exp.launchers.local`."""

from __future__ import annotations

from collections.abc import Mapping

from qwen3exp.config.schema import Experiment
from qwen3exp.config.sections.launcher import LocalLauncher
from qwen3exp.errors import ConfigError, Problem
from qwen3exp.plan.nodes import STANDALONE_ENDPOINT, STANDALONE_ID, Placement
from qwen3exp.run import timelimit


class LocalNodes:
    """`Nodes` of `LocalLauncher`."""

    def placement(self, exp: Experiment, env: Mapping[str, str]) -> Placement:
        la = exp.launcher
        assert isinstance(la, LocalLauncher)
        if la.node_rank is not None:
            node_rank, how = la.node_rank, "launcher.node_rank"
        elif la.nnodes == 1:
            node_rank, how = 0, "one node"
        elif "SLURM_NODEID" in env:
            node_rank, how = int(env["SLURM_NODEID"]), "SLURM_NODEID from the environment"
        elif exp.dry_run:  # planning: every node's command is shown; a real launch needs the rank
            node_rank, how = 0, "launcher.node_rank not set: required when the run starts"
        else:
            raise ConfigError(
                [
                    Problem(
                        "launcher.node_rank",
                        None,
                        f"nnodes={la.nnodes} needs this node's rank and SLURM_NODEID is not set",
                        f"0..{la.nnodes - 1}",
                        "set launcher.node_rank=... on each node, or start the launchers with srun",
                    )
                ]
            )
        if node_rank >= la.nnodes:
            raise ConfigError(
                [
                    Problem(
                        "launcher.node_rank",
                        node_rank,
                        f"({how}) must be below nnodes ({la.nnodes})",
                        f"0..{la.nnodes - 1}",
                    )
                ]
            )
        if la.nnodes == 1 and not la.rdzv_endpoint:
            return Placement(1, 0, STANDALONE_ENDPOINT, STANDALONE_ID, how)
        hint = (
            (
                f"start the same command on each of the {la.nnodes} nodes with launcher.node_rank=0..{la.nnodes - 1} "
                f"(same rdzv_endpoint and, on a shared file system, the same hydra.run.dir)"
            )
            if la.nnodes > 1
            else None
        )
        assert la.rdzv_endpoint is not None  # the schema requires one for nnodes > 1
        return Placement(la.nnodes, node_rank, la.rdzv_endpoint, exp.name, how, per_node_hint=hint)

    def notes(self, exp: Experiment, where: Placement) -> list[str]:
        if where.nnodes == 1:
            return []
        return [
            f"this is node {where.node_rank} of {where.nnodes} ({where.how}); c10d rendezvous at {where.rdzv_endpoint}",
            f"other nodes: {where.per_node_hint}",
        ]

    def time_limit_deadline(self, exp: Experiment, env: Mapping[str, str]) -> float | None:
        return None  # no scheduler's time limit: only a signal someone sends asks the ranks to stop

    def time_limit_outcome(self, exp: Experiment, record: dict, env: Mapping[str, str]) -> tuple[str, int, str]:
        return timelimit.not_requeued(timelimit.stopped_at_limit(record), "launcher.requeue=false")

"""The `launcher` section: torchrun on this machine (`local`) or a SLURM job per run (`slurm`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from qwen3exp.config.sections.base import NodeCount, NonNegInt, PerNode, PosInt, Strict, tagged


class LocalLauncher(Strict):
    """torchrun on this machine; with nnodes > 1, one such launcher per node."""

    kind: Literal["local"] = "local"
    nnodes: NodeCount = 1
    """Nodes of the run (one launcher per node, each with the same nnodes and rdzv_endpoint)."""
    nproc_per_node: PerNode | None = None
    """Ranks per node; None: the platform decides (cpu: platform.ranks_per_node)."""
    node_rank: NonNegInt | None = None
    """This node's index (0 writes summary.json); None: 0 on one node, else SLURM_NODEID from the
    environment (a launcher started by srun)."""
    rdzv_endpoint: str | None = None
    """host:port of the c10d rendezvous (on one node of the job); required when nnodes > 1."""
    max_restarts: NonNegInt = 0
    """torchrun restarts of all ranks after a rank fails."""
    stop_timeout_s: Annotated[float, Field(gt=0)] = 5.0
    """After Ctrl-C/SIGTERM, seconds to wait for the ranks before killing them."""
    rdzv_timeout_s: PosInt = 300
    """Seconds a torchrun agent waits for the c10d rendezvous (the endpoint to answer, the other
    nodes to join) before the launch fails naming the endpoint."""

    @model_validator(mode="after")
    def _multinode(self) -> LocalLauncher:
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError(
                tagged(
                    "rdzv_endpoint",
                    None,
                    f"nnodes={self.nnodes} needs a rendezvous endpoint",
                    "host:port reachable from every node",
                    "e.g. launcher.rdzv_endpoint=node0:29500 on every node",
                )
            )
        if self.rdzv_endpoint is not None:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not host or not port.isdigit() or not 0 <= int(port) < 65536:
                raise ValueError(
                    tagged("rdzv_endpoint", self.rdzv_endpoint, "not a host:port", "host:port", "e.g. 127.0.0.1:29500")
                )
        if self.node_rank is not None and self.node_rank >= self.nnodes:
            raise ValueError(
                tagged("node_rank", self.node_rank, f"must be below nnodes ({self.nnodes})", f"0..{self.nnodes - 1}")
            )
        return self


SbatchValue = str | int | bool


class SlurmLauncher(Strict):
    """One SLURM job per run (a job array per sweep) through hydra-submitit-launcher; inside the
    job, srun starts one torchrun agent per node with a c10d rendezvous on the first node."""

    kind: Literal["slurm"] = "slurm"
    nnodes: NodeCount = 1
    """Nodes per job (sbatch --nodes)."""
    nproc_per_node: PerNode | None = None
    """Ranks per node; None: the platform decides (cpu: platform.ranks_per_node)."""
    cpus_per_node: PerNode | None = None
    """CPU cores requested per node (the node's one task: sbatch --cpus-per-task); None: the
    cluster's default."""
    mem_gb: PosInt | None = None
    """Memory per node (sbatch --mem); None: the cluster's default."""
    gpus_per_node: NonNegInt | None = None
    """GPUs per node (sbatch --gpus-per-node); None: none requested."""
    partition: str | None = None
    """sbatch --partition; None: the cluster's default partition."""
    account: str | None = None
    """sbatch --account."""
    time_limit_min: PosInt = 60
    """sbatch --time, in minutes."""
    additional_parameters: dict[str, SbatchValue] = {}
    """More sbatch options, e.g. {exclusive: true, qos: high, constraint: trn2}."""
    setup: list[str] = []
    """Shell lines the job runs before Python starts (module load ..., source ...)."""
    array_parallelism: PosInt = 256
    """Sweep jobs (array tasks) allowed to run at once."""
    srun: bool | None = None
    """How the torchrun agents start in the job. None: torchrun directly on one node, srun (one
    agent per node) when nnodes > 1; true: srun also on one node."""
    max_restarts: NonNegInt = 0
    """torchrun restarts of all ranks after a rank fails."""
    stop_timeout_s: Annotated[float, Field(gt=0)] = 5.0
    """After scancel/SIGTERM, seconds to wait for the ranks before killing them."""
    rdzv_timeout_s: PosInt = 300
    """Seconds a torchrun agent waits for the c10d rendezvous before the job fails naming it."""
    signal_delay_s: PosInt = 120
    """SLURM's pre-timeout signal (sbatch --signal=USR2@S, submitit's) comes this many seconds
    before the time limit: with checkpoint=dcp the ranks then save a checkpoint and stop."""
    requeue: bool = False
    """At the pre-timeout signal, after the checkpoint, requeue the job (same job id, same run
    directory); the requeued job resumes from that checkpoint. Needs checkpoint=dcp."""
    max_requeues: NonNegInt = 3
    """How many times a job may requeue itself (submitit's max_num_timeout)."""

    @model_validator(mode="after")
    def _agents(self) -> SlurmLauncher:
        if self.srun is False and self.nnodes > 1:
            raise ValueError(
                tagged("srun", False, f"nnodes={self.nnodes} needs srun to start one agent per node", "null or true")
            )
        if self.srun is False and self.requeue:
            raise ValueError(
                tagged(
                    "srun",
                    False,
                    "requeue=true needs srun: SLURM sends its pre-timeout signal "
                    "to job steps only, not to the batch script's processes",
                    "null or true",
                )
            )
        if self.signal_delay_s >= self.time_limit_min * 60:
            raise ValueError(
                tagged(
                    "signal_delay_s",
                    self.signal_delay_s,
                    f"must be below the time limit ({self.time_limit_min} min = {self.time_limit_min * 60} s)",
                    f"1..{self.time_limit_min * 60 - 1}",
                )
            )
        return self


Launcher = Annotated[LocalLauncher | SlurmLauncher, Field(discriminator="kind")]

"""The platform of ranks that run on other machines: a `launcher=slurm` job planned on the host it
is submitted from (a login node), which is none of the job's nodes.

Nothing of this host is probed or used for such a plan (its devices, memory and cores are not the
job's): the facts come from the platform section and from what the scheduler says of the job's
nodes (`JobNode`: `qwen3exp.plan.slurm_partition` asks `sinfo` about the partition, and the job's own
requests, `launcher.cpus_per_node` and `launcher.mem_gb`, come first). platform=auto takes the
nodes' GPUs or Neuron devices (their gres), else the CPU. The devices themselves are checked when
the job starts: inside it the same launcher plans again, on its first node, with a real device check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from qwen3exp.config.sections.platform import AutoPlatform, CpuPlatform, CudaPlatform, NeuronPlatform
from qwen3exp.platforms import cpu, cuda, neuron
from qwen3exp.platforms.variant import PlatformFacts
from qwen3exp.units import GIB

CHECKED_IN_THE_JOB = "the job checks its devices on its first node when it starts"


@dataclass(frozen=True)
class JobNode:
    """What is known here of one node the job's ranks run on (None: nothing said)."""

    source: str
    """Where it comes from, for the plan (`sinfo -p trn2`, or why sinfo said nothing)."""
    cpus: int | None = None
    memory_bytes: int | None = None
    gpus: int | None = None
    neuron_devices: int | None = None

    def describe(self) -> str:
        known = [
            f"{self.cpus} CPUs" if self.cpus else None,
            f"{self.memory_bytes / GIB:.0f} GiB" if self.memory_bytes else None,
            f"{self.gpus} GPU(s)" if self.gpus else None,
            f"{self.neuron_devices} Neuron device(s)" if self.neuron_devices else None,
        ]
        return f"{self.source}: " + (", ".join(k for k in known if k) or "nothing known")


def facts(platform, node: JobNode, *, nproc_per_node: int | None) -> PlatformFacts:
    """The facts a plan made here uses for ranks on `node`'s machines."""
    if isinstance(platform, AutoPlatform):
        platform = CudaPlatform() if node.gpus else NeuronPlatform() if node.neuron_devices else CpuPlatform()
        how = f"platform=auto on the job's nodes ({node.describe()}): {platform.name}"
    else:
        how = f"platform={platform.name} on the job's nodes ({node.describe()})"
    return BY_SECTION[type(platform)](platform, node, nproc_per_node, f"{how}; {CHECKED_IN_THE_JOB}")


def _cpu(cfg: CpuPlatform, node: JobNode, nproc_per_node: int | None, reason: str) -> PlatformFacts:
    base = cpu.facts(cfg, nproc_per_node=nproc_per_node, dry_run=True, reason=reason)
    ranks = nproc_per_node or cfg.ranks_per_node
    threads = cfg.threads_per_rank or max(1, (node.cpus or ranks) // ranks)
    if cfg.memory_per_rank_gib:
        memory = int(cfg.memory_per_rank_gib * GIB)
    elif node.memory_bytes:
        memory = node.memory_bytes // ranks
    else:  # nothing known: not this host's either; the job's own plan checks it
        memory, reason = UNKNOWN_MEMORY, reason + " (host memory not known here: not checked before submitting)"
    return replace(
        base,
        reason=reason,
        memory_per_rank_bytes=memory,
        devices_per_node=node.cpus,
        env={**base.env, "OMP_NUM_THREADS": str(threads), "QWEN3EXP_CPU_THREADS": str(threads)},
        sustained_flops_per_rank=cpu.FLOPS_PER_THREAD * threads,
    )


UNKNOWN_MEMORY = 1 << 50
"""Memory per rank when neither the section, the job's request nor the scheduler says (1 PiB: no
refusal here; the job, planning on its node, checks the real figure)."""


def _cuda(cfg: CudaPlatform, node: JobNode, nproc_per_node: int | None, reason: str) -> PlatformFacts:
    planned = cfg.model_copy(update={"assumed_gpus_per_node": node.gpus}) if node.gpus else cfg
    base = cuda.facts(planned, nproc_per_node=nproc_per_node, dry_run=True, reason=reason, here=False)
    return replace(base, reason=reason, devices_per_node=node.gpus)


def _neuron(cfg: NeuronPlatform, node: JobNode, nproc_per_node: int | None, reason: str) -> PlatformFacts:
    base = neuron.facts(cfg, nproc_per_node=nproc_per_node, dry_run=True, reason=reason)  # the instance table
    return replace(base, reason=reason)


BY_SECTION: dict[type, Callable[..., PlatformFacts]] = {CpuPlatform: _cpu, CudaPlatform: _cuda, NeuronPlatform: _neuron}

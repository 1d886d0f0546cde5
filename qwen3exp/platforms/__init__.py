"""Platforms: every device adaptation lives here, with its reason.

`resolve()` runs in the launcher (cheap: no torchtitan import) and turns the validated platform
section into `PlatformFacts`: the device, the distributed backend, ranks per node, memory per rank,
the attention kernel and the environment for the ranks. `prepare_worker()` runs first thing in each
rank, before torchtitan is imported, because torchtitan binds the device type at import time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qwen3exp.errors import ConfigError, Problem


@dataclass(frozen=True)
class PlatformFacts:
    name: str
    """cpu | cuda | neuron: the platform actually used."""
    reason: str
    """Why this platform (for platform=auto: what was detected)."""
    device_type: str
    dist_backend: str
    ranks_per_node: int
    """Ranks per node when launcher.nproc_per_node is null."""
    memory_per_rank_bytes: int
    attention: str
    """Inner attention kernel: sdpa (dense document mask + F.scaled_dot_product_attention) or flex."""
    compile_backend: str
    peak_flops_per_rank: float | None
    """For MFU; None where no meaningful peak exists (CPU)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables set for every rank."""
    force_sum_reductions: bool = False
    """FSDP comms must use plain SUM (gloo has no PREMUL_SUM)."""
    devices_per_node: int | None = None
    """Devices the ranks of this node bind to (GPUs, NeuronCores; CPU cores); None: unknown here
    (e.g. a job submitted to other machines). The plan checks ranks per node against it."""
    devices_exclusive: bool = True
    """True: at most one rank per device (an error beyond); False: ranks may share (CPU cores; a
    warning that it will be slow)."""


def resolve(platform, *, nproc_per_node: int | None = None) -> PlatformFacts:
    """Resolve the platform section of a validated Experiment (launcher side)."""
    from qwen3exp.platforms import cpu

    match platform.name:
        case "cpu":
            return cpu.facts(platform, nproc_per_node=nproc_per_node, reason="platform=cpu")
        case "auto":
            return _auto(nproc_per_node)
    raise ConfigError([Problem("platform.name", platform.name, "unknown platform", "auto, cpu")])


def _auto(nproc_per_node: int | None) -> PlatformFacts:
    from qwen3exp.platforms import cpu
    from qwen3exp.schema import CpuPlatform

    # CUDA and Neuron detection are added with their platforms; until then auto means cpu.
    return cpu.facts(CpuPlatform(), nproc_per_node=nproc_per_node,
                     reason="platform=auto: no CUDA GPU and no torch_neuronx found, using cpu")


def prepare_worker(facts: PlatformFacts) -> None:
    """Run in each rank before the first torchtitan import."""
    from qwen3exp.platforms import cpu

    match facts.name:
        case "cpu":
            cpu.prepare_worker(facts)

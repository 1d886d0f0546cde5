"""Platforms: every device adaptation lives here, with its reason; this module finds the platform's module.

`resolve()` runs in the launcher (cheap: no torchtitan import; a device probe runs in a short-lived
subprocess only where a device may exist) and turns the validated platform section into
`PlatformFacts`: the device, the distributed backend, ranks per node, memory per rank, the attention
kernel and the environment for the ranks. `experiment_problems()` lists the rules that need the
platform; `host_problems()` what the ranks need from this host (CPU memory and cores).
`prepare_worker()` runs first thing in each rank, before torchtitan is imported, because torchtitan
binds the device type at import time. `device_names()` is for provenance.json, `probed()` for the
device probe process.

Modules: one per platform (`cpu`, `cuda`, `neuron`), each following `variant.PlatformModule`; this
registry finds it from the validated section's class (`BY_SECTION`) or from the resolved facts'
name (`BY_NAME`), and resolves platform=auto (`AUTO_ORDER`). `variant` (the facts and the protocol),
`host` (this host's CPU and memory), `probe` (finding devices). A new platform is one module here,
its section class in `qwen3exp.config.sections.platform` (with the hardware table the Neuron
platform plans with, `INSTANCES`), its `conf/platform/<name>.yaml`, and one entry in `PLATFORMS`.
"""

from __future__ import annotations

from qwen3exp.config.sections.platform import AutoPlatform
from qwen3exp.errors import ConfigError, Problem
from qwen3exp.platforms import cpu, cpu_device, cuda, neuron
from qwen3exp.platforms.variant import ALLOWED, DetectedPlatform, DeviceProbe, PlatformFacts, PlatformModule

__all__ = [
    "PlatformFacts",
    "agent_forks",
    "device_names",
    "experiment_problems",
    "host_problems",
    "prepare_worker",
    "probed",
    "resolve",
]

PLATFORMS: tuple[PlatformModule, ...] = (cpu, cuda, neuron)
"""Every platform's module (platform=auto is the registry's own resolution, `AUTO_ORDER`)."""
BY_SECTION: dict[type, PlatformModule] = {m.SECTION: m for m in PLATFORMS}
BY_NAME: dict[str, PlatformModule] = {m.NAME: m for m in PLATFORMS}
"""For what comes back as a name: `PlatformFacts.name` (platform.json, the device probe's argument)."""
AUTO_ORDER: tuple[DetectedPlatform, ...] = (cuda, neuron)
"""platform=auto takes the first of these whose device is here, else `AUTO_FALLBACK`."""
AUTO_FALLBACK: PlatformModule = cpu


def resolve(platform, *, nproc_per_node: int | None = None, dry_run: bool = False) -> PlatformFacts:
    """Resolve the platform section of a validated Experiment (launcher side).

    A real launch checks the device (and fails with a ConfigError, exit 2, when it is missing or
    disagrees with the configuration); a dry run plans without touching a Neuron device."""
    if isinstance(platform, AutoPlatform):
        return _auto(nproc_per_node, dry_run)
    module = BY_SECTION.get(type(platform))
    if module is None:
        raise ConfigError([Problem("platform.name", platform.name, "unknown platform", ALLOWED)])
    return module.facts(platform, nproc_per_node=nproc_per_node, dry_run=dry_run, reason=f"platform={module.NAME}")


def _auto(nproc_per_node: int | None, dry_run: bool) -> PlatformFacts:
    """cuda if torch sees a GPU, else neuron if torch_neuronx is usable, else cpu; says why."""
    why: list[str] = []
    for module in AUTO_ORDER:
        found = module.detect(nproc_per_node=nproc_per_node, dry_run=dry_run)
        if isinstance(found, PlatformFacts):
            return found
        why.append(found)
    return AUTO_FALLBACK.facts(
        AUTO_FALLBACK.SECTION(),
        nproc_per_node=nproc_per_node,
        dry_run=dry_run,
        reason="platform=auto: " + "; ".join(why) + f": using {AUTO_FALLBACK.NAME}",
    )


def experiment_problems(exp, facts: PlatformFacts) -> list[Problem]:
    """Cross-field rules that need the resolved platform."""
    module = BY_NAME.get(facts.name)
    return module.experiment_problems(exp, facts) if module else []


def host_problems(
    exp, facts: PlatformFacts, *, ranks: int, plan_bytes_per_rank: int | None, total_params: int = 0
) -> list[Problem]:
    """What this host must give the `ranks` ranks it starts besides devices: on the CPU platform its
    memory (the ranks, the torchrun agent and this launcher, `cpu.HostMemory`) and its cores
    (`cpu.host_problems`). Nothing for ranks on other machines (launcher=slurm: the plan runs where
    the job is submitted) or on accelerators (their memory is the device's, checked by the plan).
    `total_params`: the model's, for the launcher's verification of an HF export."""
    module = BY_NAME.get(facts.name)
    if module is None:
        return []
    return module.launch_problems(
        exp, facts, ranks=ranks, plan_bytes_per_rank=plan_bytes_per_rank, total_params=total_params
    )


def prepare_worker(facts: PlatformFacts) -> None:
    """Run in each rank before the first torchtitan import."""
    module = BY_NAME.get(facts.name)
    if module is None:
        raise RuntimeError(f"qwen3exp: unknown platform {facts.name!r} in platform.json")
    module.prepare_worker(facts)


def agent_forks(facts: PlatformFacts) -> bool:
    """Whether the launcher forks this node's agent (`qwen3exp.run.forked_agent`) instead of starting
    it anew: a platform whose ranks fork from their agent (only the CPU's), and a launcher whose fork
    can still prepare it (it has not imported torchtitan to match kernel overrides, say)."""
    return facts.forked_ranks and cpu_device.fork_ready()


def device_names(facts: PlatformFacts) -> list[str]:
    """This host's devices of the resolved platform, for provenance.json."""
    module = BY_NAME.get(facts.name)
    return module.device_names() if module else []


def probed() -> dict[str, DeviceProbe]:
    """The platforms with a device probe, by name (`python -m qwen3exp.titan.device_probe NAME`)."""
    return {m.NAME: m.probe_device for m in PLATFORMS if m.probe_device is not None}

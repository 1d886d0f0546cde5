"""Platforms: every device adaptation lives here, with its reason.

`resolve()` runs in the launcher (cheap: no torchtitan import; a device probe runs in a short-lived
subprocess only where a device may exist) and turns the validated platform section into
`PlatformFacts`: the device, the distributed backend, ranks per node, memory per rank, the attention
kernel and the environment for the ranks. `experiment_problems()` lists the rules that need the
platform; `host_problems()` what the ranks need from this host (CPU memory and cores).
`prepare_worker()` runs first thing in each rank, before torchtitan is imported, because torchtitan
binds the device type at import time.

Modules: `cpu`, `cuda`, `neuron` (one per platform), `probe` (finding devices). The Trainium
hardware table (`INSTANCES`) is in `qwen3exp.config.schema`, which validates platform.instance_type
against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qwen3exp.errors import ConfigError, Problem


@dataclass(frozen=True)
class PlatformFacts:
    name: str
    """cpu | cuda | neuron: the platform actually used."""
    reason: str
    """Why this platform (for platform=auto: what was detected) and whether the device was checked."""
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
    device_name: str | None = None
    """The accelerator's name as the device reports it (or the planning table's, when not checked)."""
    device_checked: bool = True
    """False when the numbers come from a table because no device was probed (a dry run)."""
    lnc: int | None = None
    """Neuron only: the Logical NeuronCore config (physical cores per rank); None elsewhere."""
    run_dir_env: dict[str, str] = field(default_factory=dict)
    """Environment variables whose value is a folder inside the run directory (the launcher joins
    them with the run directory), e.g. the Neuron compile cache."""
    comm_init_timeout_s: int | None = None
    """torchtitan's timeout for collectives up to the end of step 1; None: torchtitan's default."""


def resolve(platform, *, nproc_per_node: int | None = None, dry_run: bool = False) -> PlatformFacts:
    """Resolve the platform section of a validated Experiment (launcher side).

    A real launch checks the device (and fails with a ConfigError, exit 2, when it is missing or
    disagrees with the configuration); a dry run plans without touching a Neuron device."""
    from qwen3exp.platforms import cpu, cuda, neuron

    match platform.name:
        case "cpu":
            return cpu.facts(platform, nproc_per_node=nproc_per_node, reason="platform=cpu")
        case "cuda":
            return cuda.facts(platform, nproc_per_node=nproc_per_node, dry_run=dry_run, reason="platform=cuda")
        case "neuron":
            return neuron.facts(platform, nproc_per_node=nproc_per_node, dry_run=dry_run, reason="platform=neuron")
        case "auto":
            return _auto(nproc_per_node, dry_run)
    raise ConfigError([Problem("platform.name", platform.name, "unknown platform", "auto, cpu, cuda, neuron")])


def _auto(nproc_per_node: int | None, dry_run: bool) -> PlatformFacts:
    """cuda if torch sees a GPU, else neuron if torch_neuronx is usable, else cpu; says why."""
    from qwen3exp.config.schema import CpuPlatform, CudaPlatform, NeuronPlatform
    from qwen3exp.platforms import cpu, cuda, neuron, probe

    why: list[str] = []
    hint = probe.cuda_hint()
    if hint is None:
        why.append("no CUDA GPU (no /dev/nvidia* device)")
    else:
        info = probe.probe("cuda")
        if info.get("available") and info.get("count", 0) > 0:
            return cuda.facts(CudaPlatform(), nproc_per_node=nproc_per_node, dry_run=dry_run,
                              reason=f"platform=auto: {info['count']} CUDA GPU(s) visible ({info.get('name')})")
        why.append(f"{hint} but torch sees no CUDA GPU ({info.get('error') or 'torch.cuda.is_available() is False'})")
    hint = probe.neuron_hint()
    if hint is None:
        why.append("torch_neuronx is not installed")
    elif dry_run:
        return neuron.facts(NeuronPlatform(), nproc_per_node=nproc_per_node, dry_run=True,
                            reason=f"platform=auto: {hint}")
    else:
        cfg = NeuronPlatform()
        info = probe.probe("neuron", neuron.probe_env(cfg))
        if info.get("importable") and info.get("available") and info.get("count", 0) > 0:
            return neuron.facts(cfg, nproc_per_node=nproc_per_node, dry_run=False,
                                reason=f"platform=auto: {info['count']} NeuronCore(s) visible ({info.get('name')})")
        why.append(f"{hint} but no NeuronCore is usable "
                   f"({info.get('error') or 'torch.neuron.is_available() is False'})")
    return cpu.facts(CpuPlatform(), nproc_per_node=nproc_per_node,
                     reason="platform=auto: " + "; ".join(why) + ": using cpu")


def experiment_problems(exp, facts: PlatformFacts) -> list[Problem]:
    """Cross-field rules that need the resolved platform."""
    problems: list[Problem] = []
    match exp.model.attention, facts.name:  # every model backend has `attention`
        case "flex", "neuron":
            problems.append(Problem(
                "model.attention", "flex", "FlexAttention is not available on Neuron (it has only an "
                "inductor lowering; torchtitan refuses to compile it with backend 'neuron')", "auto, sdpa"))
        case "flex", "cpu":
            problems.append(Problem(
                "model.attention", "flex", "FlexAttention has no backward on the CPU", "auto, sdpa"))
    return problems


def host_problems(exp, facts: PlatformFacts, *, ranks: int, plan_bytes_per_rank: int | None,
                  total_params: int = 0) -> list[Problem]:
    """What this host must give the `ranks` ranks it starts besides devices: on the CPU platform its
    memory (the ranks, the torchrun agent and this launcher, `cpu.HostMemory`) and its cores
    (`cpu.host_problems`). Nothing for ranks on other machines (launcher=slurm: the plan runs where
    the job is submitted) or on accelerators (their memory is the device's, checked by the plan).
    `total_params`: the model's, for the launcher's verification of an HF export."""
    from qwen3exp.config.schema import HFExport, HFRoundtrip
    from qwen3exp.platforms import cpu

    if facts.name != "cpu" or exp.launcher.kind != "local":
        return []
    ranks_key = "launcher.nproc_per_node" if exp.launcher.nproc_per_node else "platform.ranks_per_node"
    threads_given = exp.platform.name == "cpu" and exp.platform.threads_per_rank is not None
    export = exp.checkpoint.dtype if isinstance(exp.checkpoint, HFExport | HFRoundtrip) else None
    return cpu.host_problems(facts, ranks=ranks, plan_bytes_per_rank=plan_bytes_per_rank, ranks_key=ranks_key,
                             threads_given=threads_given, kernels_active=exp.kernels.active,
                             export_dtype_bytes={"float32": 4, "bfloat16": 2, "float16": 2}.get(export or "", 0),
                             total_params=total_params)


def prepare_worker(facts: PlatformFacts) -> None:
    """Run in each rank before the first torchtitan import."""
    from qwen3exp.platforms import cpu, cuda, neuron

    match facts.name:
        case "cpu":
            cpu.prepare_worker(facts)
        case "cuda":
            cuda.prepare_worker(facts)
        case "neuron":
            neuron.prepare_worker(facts)
        case _:
            raise RuntimeError(f"qwen3exp: unknown platform {facts.name!r} in platform.json")

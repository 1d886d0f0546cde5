"""CPU platform: what torchtitan 0.3.0 needs to train on a machine without an accelerator.

Each adaptation states the upstream behaviour it answers:
1. Device type. `torchtitan/tools/utils.py` binds `device_type = _get_available_device_type() or
   "cuda"` at import, so on a CPU-only host torchtitan believes it has CUDA (`_cuda_setDevice`
   error). `prepare_worker` (in `cpu_device`, the rank's side) makes torch report "cpu" before
   torchtitan is imported.
2. Device module. torchtitan's memory monitor calls CUDA-style functions on the device module
   (`get_device_properties`, `memory_stats`, `reset_peak_memory_stats`, ...), which `torch.cpu` lacks.
   `cpu_device.CpuDeviceModule` answers them with the process's real peak resident memory (VmHWM).
3. Attention. FlexAttention has no CPU backward and torchtitan 0.3.0 rejects `sdpa` for language
   models: the CPU uses qwen3exp's SDPA (document mask or is_causal: `qwen3exp.plan.attention_path`).
4. FSDP over gloo. torchtitan sets a gradient divide factor, which makes FSDP reduce with
   `ReduceOp.PREMUL_SUM`; gloo rejects it. `force_sum_reductions` makes FSDP use plain SUM (the
   gradient scaling torchtitan does itself is unchanged, so the math is the same).
5. Compilation. torch.compile of the block-mask creation costs 7-20 s on the first CPU step; the
   SDPA path creates no block mask, and model compilation stays off unless training.compile=true.

Before launch (`host_problems`): the ranks of this node share its memory and cores. The plan's
per-rank step peak (total + transients) counts the model only; `HostMemory` adds what the processes of a launch hold
beside it (measured, see `RANK_RUNTIME_BYTES`): each rank's runtime and transients, the torchrun
agent, and this launcher, whose own peak comes while it completes and verifies an HF export (after
the ranks have exited). The larger of the two phases must fit in what the host has available now.
More threads than cores is slow (the plan warns); more than `OVERSUBSCRIPTION_LIMIT` threads per
core is refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from qwen3exp.config.sections.launcher import LocalLauncher
from qwen3exp.config.sections.platform import CpuPlatform
from qwen3exp.errors import Problem
from qwen3exp.platforms.cpu_device import prepare_worker as prepare_worker  # the protocol's, where torch is
from qwen3exp.platforms.host import available_memory, cpu_name, physical_memory
from qwen3exp.platforms.variant import PlatformFacts, section_name
from qwen3exp.units import GIB, MIB, gib

SECTION = CpuPlatform
NAME = section_name(SECTION)
probe_device = None
"""Nothing to probe: the launcher's own process sees the CPU the ranks get."""

RANK_RUNTIME_BYTES = 940 * MIB
"""What a CPU rank holds beyond its plan and the plan's transients: Python, torch, torchtitan, datasets.

Forked from their agent (`forked_ranks`), which imported torchtitan, ranks hold only the library
pages they touch: a tiny 2-rank run (3 steps, sampled as below) peaked at 2,201 MiB (launcher 83,
agent 870, ranks 628-633). Counted: 940 MiB (620 beyond the tiny plan + the CI machine's 316, below),
a figure 1.28x that peak. The table is from spawned ranks (a new interpreter each).

Measured (torch 2.14.1, torchtitan 0.3.0, Python 3.11, 2 cores): `python -m qwen3exp ...` run while
a sampler reads VmRSS and VmHWM (/proc/<pid>/status) of every process below it every 50 ms: the
launcher, the torchrun agent (`qwen3exp.run.agent`) and each rank (`qwen3exp.worker`); a process's
peak is the largest value seen (a rank's VmHWM alone is not its peak: this module's
`reset_peak_memory_stats` resets it every step). MiB of resident memory; plan = plan.json
`memory.total` per rank; all `platform=cpu`, seq_len 32 x batch 1 unless said:

    model (parameters), ranks, training.dtype        plan   rank peak  beyond plan  (beyond - 914) / plan
    tiny (6 steps, seq_len 64 x 2), 2, float32         11     925         914           -
    0.6B dims, 2 layers, vocab 32768 (65M), 2, bf16   640    2061        1421          0.79
      the same, 2 ranks, float32                      888    2289        1401          0.55
      the same, 1 rank, bfloat16                      504    2173        1669          1.50
      the same, 1 rank, float32                      1000    2786        1786          0.87
    0.6B dims, 4 layers (219M), 2, bf16              2633    5634        3001          0.79
    Qwen3-0.6B (596M), 2, bf16 (*)                   4157    7987, 8499  3830, 4342    0.70, 0.82

The tiny rank is nearly all runtime (914 MiB, of which ~375 MiB are the libraries' shared pages:
counted in every process, as an RSS sum does). The rest grows with the plan, not with a constant:
`RANK_TRANSIENT_FRACTION`. The agent peaked at 647 MiB beside 2 ranks (538-625 MiB beside 1). The
launcher: 48 MiB while it plans and waits (it imports neither torch nor torchtitan), 855 MiB when
kernel overrides are matched (torchtitan imported), and while it completes and verifies an HF
export: 771 MiB for tiny, 2018 MiB for the 219M model exported in bfloat16, i.e. 768 MiB + 6.0 bytes
per parameter (transformers' float32 copy, 4, plus the bfloat16 export read through mmap, 2).
(*) ranks as tests/bench/bench_hf_0p6b.py measured them (tests/test_hf_realistic.py). The figure,
against the most all processes held at once: tiny 1.06x (tests/test_platform_cpu.py), 0.6B 18.7 GiB
for 16.8 GiB (the figure before these measurements: 0.88x and 10.2 GiB).

The CI machine measured 316 MiB more per rank (spawned): the figure covers the larger machine."""
MEASURED_RUNTIME_BYTES = {"native": 625 * MIB, "hf": 690 * MIB}
"""What a rank's measure (its resident peak, VmHWM: `cpu_device`) holds beside the model, by model
backend: Python, torch, torchtitan, the data (model=hf adds transformers). Measured on the tiny rows
of tests/bench/bench_memory.py (torch 2.14.1, torchtitan 0.3.0, this 2-core host; the tiny model's
own plan subtracted), ranks forked from their agent: 305 MiB less than a new interpreter's (930 and
1,000 MiB; tiny dp2 0.990 -> 0.692 GiB, hf dp2 1.049 -> 0.744). The CI machine measured 316 MiB more
per rank (`RANK_RUNTIME_BYTES`, which refuses early); this figure is for the score, not the refusal."""
RETAINED_FRACTION = 0.0
"""Of the model's step peak, what glibc's heap keeps resident after torch frees it (VmHWM counts
it): 0 here, because the rows it was measured on fitted it into `memory_peak.HEAD_COPIES`."""
RANK_TRANSIENT_FRACTION = 0.15
"""What a rank holds beyond the plan's step peak (total + transients, `qwen3exp.plan.memory_peak`),
as a fraction of it: heap the allocator keeps, 0-8% measured on tests/bench/bench_memory.py's rows,
and a margin. (Before the step peak was modelled, the plan's total alone: 0.55-1.50 of it, above.)"""
AGENT_BYTES = 880 * MIB
"""The torchrun agent of this node, which has imported torchtitan to fork its ranks (870 MiB
measured beside 2 ranks; 647 MiB when it imported only torch and started each rank anew)."""
LAUNCHER_BYTES = 50 * MIB
"""This launcher while the ranks run, for a plain experiment (48 MiB measured)."""
LAUNCHER_TORCH_BYTES = 860 * MIB
"""This launcher once it has imported torch: torchtitan to match kernel overrides (855 MiB
measured), transformers to verify an HF export (768 MiB beside the model)."""
VERIFY_BYTES_PER_PARAM = 4
"""The HF export's verification loads the model with transformers in float32, reading the export's
shards through mmap (their dtype's bytes per parameter come on top)."""
FLOPS_PER_THREAD = 25e9
"""What one CPU thread sustains in float32 matrix products, for parallelism=auto's cost model: 24.8
GFLOP/s measured here (torch 2.14.1, one thread, 1024 x 1024 float32 matmul, AMD EPYC, 2 cores).
A rank gets its threads' worth (platform.threads_per_rank, or cores / ranks)."""
GLOO_BYTES_PER_S = 3e7
"""What a CPU rank sends per second in FSDP's collectives over gloo on one host: measured here
between 2 ranks (torch 2.14.1, 64 MiB float32, one thread each): all_gather_into_tensor 29 MB/s,
reduce_scatter_tensor 24 MB/s of data sent per rank (all_reduce is faster, 0.2 GB/s, but FSDP does
not use it). Slow, so on the CPU the cost model weighs communication heavily, as a run does."""
NETWORK_BYTES_PER_S = 1.25e9
"""Between CPU nodes: an assumed 10 Gb/s Ethernet link per node, shared by the node's ranks."""
OVERSUBSCRIPTION_LIMIT = 4
"""Threads per core beyond which a CPU launch is refused (from 1 it is a warning: slow, but it works)."""


@dataclass(frozen=True)
class HostMemory:
    """What a CPU launch needs from this host's memory, by part (bytes of resident memory)."""

    ranks: int
    plan_per_rank: int
    launcher: int
    """This launcher while the ranks run."""
    export: int
    """This launcher while it completes and verifies an HF export, after the ranks have exited
    (0: the run exports nothing)."""

    @property
    def per_rank(self) -> int:
        return RANK_RUNTIME_BYTES + int(self.plan_per_rank * (1 + RANK_TRANSIENT_FRACTION))

    @property
    def training(self) -> int:
        return self.ranks * self.per_rank + AGENT_BYTES + self.launcher

    @property
    def need(self) -> int:
        return max(self.training, self.export)

    def parts(self) -> str:
        transients = self.per_rank - RANK_RUNTIME_BYTES - self.plan_per_rank
        text = (
            f"{self.ranks} rank(s) x {gib(self.per_rank)} ({gib(RANK_RUNTIME_BYTES)} per-process runtime: "
            f"Python, torch, torchtitan + {gib(self.plan_per_rank)} plan + {gib(transients)} transients) + "
            f"{gib(AGENT_BYTES)} torchrun agent + {gib(self.launcher)} this launcher = {gib(self.training)} "
            "while training"
        )
        if self.export:
            text += f"; then {gib(self.export)} in this launcher to verify the HF export (the model in float32)"
        return text


def host_memory(
    *,
    ranks: int,
    plan_bytes_per_rank: int,
    kernels_active: bool = False,
    export_dtype_bytes: int = 0,
    total_params: int = 0,
) -> HostMemory:
    """The parts of `HostMemory` for `ranks` CPU ranks of this plan. `kernels_active`: the launcher
    imports torchtitan to match kernel overrides; `export_dtype_bytes` (0: no HF export): bytes per
    parameter of the export the launcher verifies; `total_params`: the model's parameters."""
    export = (
        LAUNCHER_TORCH_BYTES + (VERIFY_BYTES_PER_PARAM + export_dtype_bytes) * total_params if export_dtype_bytes else 0
    )
    return HostMemory(ranks, plan_bytes_per_rank, LAUNCHER_TORCH_BYTES if kernels_active else LAUNCHER_BYTES, export)


def host_problems(
    facts: PlatformFacts,
    *,
    ranks: int,
    plan_bytes_per_rank: int | None,
    ranks_key: str,
    threads_given: bool,
    kernels_active: bool = False,
    export_dtype_bytes: int = 0,
    total_params: int = 0,
) -> list[Problem]:
    """This host's memory and cores against the `ranks` CPU ranks it is about to start. `ranks_key`:
    the key ranks per node came from; `threads_given`: platform.threads_per_rank was set;
    `plan_bytes_per_rank` None: the plan does not fit its per-rank budget (already a problem), so
    the host's memory is not checked again; the rest: see `host_memory`."""
    problems: list[Problem] = []
    available = available_memory()
    if plan_bytes_per_rank is not None and available is not None:
        mem = host_memory(
            ranks=ranks,
            plan_bytes_per_rank=plan_bytes_per_rank,
            kernels_active=kernels_active,
            export_dtype_bytes=export_dtype_bytes,
            total_params=total_params,
        )
        if mem.need > available:
            fit = max(0, (available - AGENT_BYTES - mem.launcher) // mem.per_rank)
            fit = fit if mem.export <= available else 0
            problems.append(
                Problem(
                    ranks_key,
                    ranks,
                    f"{ranks} CPU rank(s) need about {gib(mem.need)} of host memory ({mem.parts()}), but this host "
                    f"has {gib(available)} available (MemAvailable in /proc/meminfo)",
                    f"at most {fit} rank(s) on this host" if fit else "fewer ranks, on a host with more free memory",
                    "run fewer ranks per node (launcher.nproc_per_node) and more nodes (launcher.nnodes), or free "
                    "memory",
                )
            )
    cores = facts.devices_per_node or 1
    threads = int(facts.env.get("QWEN3EXP_CPU_THREADS", "1"))
    if ranks * threads > OVERSUBSCRIPTION_LIMIT * cores:
        key, value = ("platform.threads_per_rank", threads) if threads_given and ranks <= cores else (ranks_key, ranks)
        problems.append(
            Problem(
                key,
                value,
                f"{ranks} rank(s) x {threads} thread(s) = {ranks * threads} threads on the {cores} CPU core(s) this "
                f"process may use (os.sched_getaffinity): more than {OVERSUBSCRIPTION_LIMIT} threads per core, so "
                "every rank mostly waits for a core",
                f"ranks x threads per rank at most {OVERSUBSCRIPTION_LIMIT * cores} "
                f"({OVERSUBSCRIPTION_LIMIT} per core)",
                f"e.g. launcher.nproc_per_node={min(ranks, cores)} with platform.threads_per_rank=null "
                "(cores / ranks each)",
            )
        )
    return problems


def facts(cfg, *, nproc_per_node: int | None, dry_run: bool = False, reason: str) -> PlatformFacts:
    """The CPU's facts (a dry run sees the same CPU as a real launch, so `dry_run` changes nothing)."""
    ranks = nproc_per_node or cfg.ranks_per_node
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = cfg.threads_per_rank or max(1, cores // ranks)
    mem = int(cfg.memory_per_rank_gib * GIB) if cfg.memory_per_rank_gib else physical_memory() // ranks
    return PlatformFacts(
        name=NAME,
        reason=reason,
        device_type="cpu",
        dist_backend="gloo",
        ranks_per_node=cfg.ranks_per_node,
        memory_per_rank_bytes=mem,
        attention="sdpa",
        compile_backend="inductor",
        peak_flops_per_rank=None,
        # One intra-op thread per core share: more threads than cores makes every rank slower.
        env={"OMP_NUM_THREADS": str(threads), "QWEN3EXP_CPU_THREADS": str(threads)},
        force_sum_reductions=True,
        devices_per_node=cores,
        # Ranks may share cores (slow, but it works): the plan warns instead of refusing.
        devices_exclusive=False,
        sustained_flops_per_rank=FLOPS_PER_THREAD * threads,
        link_bytes_per_s=GLOO_BYTES_PER_S,
        network_bytes_per_s=min(GLOO_BYTES_PER_S, NETWORK_BYTES_PER_S / ranks),
        # The ranks' import of torchtitan (about 7 s of CPU each) done once per node, by the agent.
        forked_ranks=True,
    )


def experiment_problems(exp, facts: PlatformFacts) -> list[Problem]:
    if exp.model.attention == "flex":  # every model backend has `attention`
        return [Problem("model.attention", "flex", "FlexAttention has no backward on the CPU", "auto, sdpa")]
    return []


def launch_problems(
    exp, facts: PlatformFacts, *, ranks: int, plan_bytes_per_rank: int | None, total_params: int = 0
) -> list[Problem]:
    """This host's memory and cores (`host_problems`) for the ranks a local launch starts here;
    nothing for ranks on other machines (launcher=slurm: the plan runs where the job is submitted)."""
    if not isinstance(exp.launcher, LocalLauncher):
        return []
    ranks_key = "launcher.nproc_per_node" if exp.launcher.nproc_per_node else "platform.ranks_per_node"
    threads_given = isinstance(exp.platform, CpuPlatform) and exp.platform.threads_per_rank is not None
    export = exp.checkpoint.dtype if exp.checkpoint.exports else None
    return host_problems(
        facts,
        ranks=ranks,
        plan_bytes_per_rank=plan_bytes_per_rank,
        ranks_key=ranks_key,
        threads_given=threads_given,
        kernels_active=exp.kernels.active,
        export_dtype_bytes={"float32": 4, "bfloat16": 2, "float16": 2}.get(export or "", 0),
        total_params=total_params,
    )


def device_names() -> list[str]:
    return [cpu_name()]


def measured_beside(exp) -> tuple[int, float]:
    """(runtime bytes, retained fraction) a rank's measured peak holds beside the model's step peak
    (`qwen3exp.plan.memory.estimate`'s `runtime`, `retained_fraction`)."""
    return MEASURED_RUNTIME_BYTES[exp.model.backend], RETAINED_FRACTION

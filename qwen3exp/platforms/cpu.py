"""CPU platform: what torchtitan 0.3.0 needs to train on a machine without an accelerator.

Each adaptation states the upstream behaviour it answers:
1. Device type. `torchtitan/tools/utils.py` binds `device_type = _get_available_device_type() or
   "cuda"` at import, so on a CPU-only host torchtitan believes it has CUDA (`_cuda_setDevice`
   error). `prepare_worker` makes torch report "cpu" before torchtitan is imported.
2. Device module. torchtitan's memory monitor calls CUDA-style functions on the device module
   (`get_device_properties`, `memory_stats`, `reset_peak_memory_stats`, ...), which `torch.cpu` lacks.
   `CpuDeviceModule` answers them with the process's real peak resident memory (VmHWM).
3. Attention. FlexAttention has no CPU backward and torchtitan 0.3.0 rejects `sdpa` for language
   models: the CPU uses qwen3exp's document-masked SDPA attention (`qwen3exp.titan.attention`).
4. FSDP over gloo. torchtitan sets a gradient divide factor, which makes FSDP reduce with
   `ReduceOp.PREMUL_SUM`; gloo rejects it. `force_sum_reductions` makes FSDP use plain SUM (the
   gradient scaling torchtitan does itself is unchanged, so the math is the same).
5. Compilation. torch.compile of the block-mask creation costs 7-20 s on the first CPU step; the
   SDPA path creates no block mask, and model compilation stays off unless training.compile=true.

Before launch (`host_problems`): the ranks of this node share its memory and cores. The plan's
per-rank estimate counts the model only; every rank is also a Python process with torch,
torchtitan and datasets loaded, so N ranks need N x (runtime + plan) plus the node's shared
libraries and the torchrun agent, which must fit in what the host has available now. More threads
than cores is slow (the plan warns); more than `OVERSUBSCRIPTION_LIMIT` threads per core is refused.
"""

from __future__ import annotations

import functools
import os
import platform as _platform

from qwen3exp.errors import Problem
from qwen3exp.platforms import PlatformFacts
from qwen3exp.units import GIB, MIB, gib

# Measured once on the development host (2 cores, 24 GiB, torch 2.x, torchtitan 0.3.0, Python 3.11):
# - `python -c "import torch, torchtitan.trainer"`: VmRSS 831 MiB = 485 MiB private (Anonymous in
#   /proc/self/smaps_rollup) + ~350 MiB shared clean pages (the libraries' code);
# - a rank of the tiny experiment (2 ranks, plan 58 MiB per rank), sampled from
#   /proc/<pid>/smaps_rollup at steps 20-32: VmRSS ~990 MiB = ~610 MiB Anonymous + ~375 MiB
#   Shared_Clean; the torchrun agent: VmRSS ~512 MiB (~283 MiB Anonymous).
# Private memory is paid per rank; the shared libraries once per node (the page cache shares them).
RANK_RUNTIME_BYTES = 600 * MIB
"""Private memory of one CPU rank beyond its plan (~610 MiB measured, less the tiny plan, rounded up)."""
NODE_RUNTIME_BYTES = 900 * MIB
"""Once per node: the shared libraries of the ranks (~375 MiB) and the torchrun agent (~512 MiB)."""
OVERSUBSCRIPTION_LIMIT = 4
"""Threads per core beyond which a CPU launch is refused (from 1 it is a warning: slow, but it works)."""


def _physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (what can be allocated without swapping); None
    where there is no /proc (not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def host_problems(facts: PlatformFacts, *, ranks: int, plan_bytes_per_rank: int | None, ranks_key: str,
                  threads_given: bool) -> list[Problem]:
    """This host's memory and cores against the `ranks` CPU ranks it is about to start. `ranks_key`:
    the key ranks per node came from; `threads_given`: platform.threads_per_rank was set;
    `plan_bytes_per_rank` None: the plan does not fit its per-rank budget (already a problem), so
    the host's memory is not checked again."""
    problems: list[Problem] = []
    available = available_memory()
    per_rank = RANK_RUNTIME_BYTES + (plan_bytes_per_rank or 0)
    need = ranks * per_rank + NODE_RUNTIME_BYTES
    if plan_bytes_per_rank is not None and available is not None and need > available:
        fit = max(0, (available - NODE_RUNTIME_BYTES) // per_rank)
        problems.append(Problem(
            ranks_key, ranks,
            f"{ranks} CPU ranks need about {gib(need)} of host memory ({ranks} x ({gib(RANK_RUNTIME_BYTES)} "
            f"per-process runtime: Python, torch, torchtitan + {gib(plan_bytes_per_rank)} plan) + "
            f"{gib(NODE_RUNTIME_BYTES)} shared libraries and torchrun agent), but this host has "
            f"{gib(available)} available (MemAvailable in /proc/meminfo)",
            f"at most {fit} rank(s) on this host" if fit else "fewer ranks, on a host with more free memory",
            "run fewer ranks per node (launcher.nproc_per_node) and more nodes (launcher.nnodes), or free memory"))
    cores = facts.devices_per_node or 1
    threads = int(facts.env.get("QWEN3EXP_CPU_THREADS", "1"))
    if ranks * threads > OVERSUBSCRIPTION_LIMIT * cores:
        key, value = ("platform.threads_per_rank", threads) if threads_given and ranks <= cores else (ranks_key, ranks)
        problems.append(Problem(
            key, value,
            f"{ranks} rank(s) x {threads} thread(s) = {ranks * threads} threads on the {cores} CPU core(s) this "
            f"process may use (os.sched_getaffinity): more than {OVERSUBSCRIPTION_LIMIT} threads per core, so "
            "every rank mostly waits for a core",
            f"ranks x threads per rank at most {OVERSUBSCRIPTION_LIMIT * cores} ({OVERSUBSCRIPTION_LIMIT} per core)",
            f"e.g. launcher.nproc_per_node={min(ranks, cores)} with platform.threads_per_rank=null "
            "(cores / ranks each)"))
    return problems


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _platform.processor() or "cpu"


def facts(cfg, *, nproc_per_node: int | None, reason: str) -> PlatformFacts:
    ranks = nproc_per_node or cfg.ranks_per_node
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = cfg.threads_per_rank or max(1, cores // ranks)
    mem = (int(cfg.memory_per_rank_gib * GIB) if cfg.memory_per_rank_gib
           else _physical_memory() // ranks)
    return PlatformFacts(
        name="cpu",
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
    )


class CpuDeviceModule:
    """The subset of the `torch.cuda` module API that torchtitan calls, for the CPU."""

    def __init__(self):
        import torch

        self._cpu = torch.cpu

    def __getattr__(self, name):
        return getattr(self._cpu, name)

    @staticmethod
    def _status(field: str) -> int:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith(field + ":"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def set_device(self, device) -> None:
        pass

    def current_device(self) -> int:
        return 0

    def device_count(self) -> int:
        return 1

    def get_device_name(self, device=None) -> str:
        return cpu_name()

    def get_device_properties(self, device=None):
        from types import SimpleNamespace

        return SimpleNamespace(name=cpu_name(), total_memory=_physical_memory())

    def memory_stats(self, device=None) -> dict[str, int]:
        peak = self._status("VmHWM")
        return {"active_bytes.all.peak": peak, "reserved_bytes.all.peak": peak,
                "num_alloc_retries": 0, "num_ooms": 0}

    def reset_peak_memory_stats(self, device=None) -> None:
        # Writing 5 to clear_refs resets the peak resident set size (VmHWM) of this process.
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass

    def empty_cache(self) -> None:
        pass

    def synchronize(self, device=None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        pass

    def manual_seed_all(self, seed: int) -> None:
        pass

    def is_available(self) -> bool:
        return True


def prepare_worker(facts: PlatformFacts) -> None:
    import torch
    import torch._utils

    if "torchtitan.tools.utils" in __import__("sys").modules:
        raise RuntimeError("qwen3exp: the CPU platform must be prepared before torchtitan is imported")
    torch.set_num_threads(int(facts.env.get("QWEN3EXP_CPU_THREADS", "1")))
    module = CpuDeviceModule()
    original = torch._utils._get_device_module
    torch._utils._get_available_device_type = lambda: "cpu"

    def device_module(device_type=None):
        return module if device_type in (None, "cpu") else original(device_type)

    # Cached like torch's own (functools.lru_cache(2)), so it is the same kind of object.
    torch._utils._get_device_module = functools.lru_cache(2)(device_module)

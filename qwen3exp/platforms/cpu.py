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
"""

from __future__ import annotations

import os
import platform as _platform

from qwen3exp.platforms import PlatformFacts


def _physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


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
    mem = (int(cfg.memory_per_rank_gib * 2**30) if cfg.memory_per_rank_gib
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
    torch._utils._get_device_module = lambda device_type=None: (
        module if device_type in (None, "cpu") else original(device_type)
    )

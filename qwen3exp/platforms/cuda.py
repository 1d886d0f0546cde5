"""CUDA platform: torchtitan's own defaults (its home ground), with the device checked up front.

Nothing is adapted: device `cuda`, process-group backend nccl, FlexAttention (torchtitan's default
for Qwen3), the inductor compile backend, one rank per visible GPU. What this module adds is the
check before launch (a real launch without a usable GPU, or with more ranks than GPUs, is a
configuration error, exit 2) and the numbers for planning: the GPU count, its memory and the peak
FLOPs torchtitan uses for MFU, probed in a subprocess (see `probe`). A dry run on a machine without
a GPU plans with platform.assumed_gpus_per_node / assumed_memory_gib and says so.

NOT RUN ON A GPU here (no GPU on the development machine): tests/gpu/smoke_cuda.sh is the prepared
check for the day one is available.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from qwen3exp.errors import ConfigError, Problem
from qwen3exp.platforms import PlatformFacts
from qwen3exp.units import GIB


def facts(cfg, *, nproc_per_node: int | None, dry_run: bool, reason: str) -> PlatformFacts:
    from qwen3exp.platforms import probe

    hint = probe.cuda_hint()
    info: dict[str, Any] = probe.probe("cuda") if hint else {"error": "no /dev/nvidia* device"}
    count = int(info.get("count") or 0) if info.get("available") else 0
    if count:
        checked = True
        ranks = cfg.gpus_per_node or count
        memory = int(cfg.memory_per_gpu_gib * GIB) if cfg.memory_per_gpu_gib else int(info["total_memory"])
        name, peak = info.get("name"), info.get("peak_flops")
        reason += f"; {count} GPU(s) checked ({name})"
        if ranks > count:
            raise ConfigError([Problem("platform.gpus_per_node", cfg.gpus_per_node,
                                       f"more ranks than visible GPUs ({count})", f"1..{count}")])
    elif dry_run:
        checked, name, peak = False, None, None
        ranks = cfg.gpus_per_node or cfg.assumed_gpus_per_node
        memory = int((cfg.memory_per_gpu_gib or cfg.assumed_memory_gib) * GIB)
        reason += (f"; device not checked (dry run, {info.get('error') or 'no CUDA GPU visible'}): planned with "
                   f"{ranks} GPU(s) of {memory / GIB:.0f} GiB")
    else:
        raise ConfigError([Problem(
            "platform", "cuda",
            f"no CUDA GPU is usable here ({info.get('error') or 'torch.cuda.is_available() is False'})",
            "auto, cpu, cuda, neuron",
            "use platform=auto or platform=cpu here; dry_run=true plans a GPU run without one")])
    return PlatformFacts(
        name="cuda",
        reason=reason,
        device_type="cuda",
        dist_backend="nccl",
        ranks_per_node=ranks,
        memory_per_rank_bytes=memory,
        attention="flex",
        compile_backend="inductor",
        peak_flops_per_rank=peak,
        device_name=name,
        device_checked=checked,
        # One rank per GPU: the plan refuses more ranks than visible GPUs (unknown without a GPU).
        devices_per_node=count or None,
        devices_exclusive=True,
    )


def prepare_worker(facts: PlatformFacts) -> None:
    """Check, in each rank before torchtitan is imported, that CUDA is usable and has a GPU for
    every local rank; torchtitan then takes over with its defaults."""
    if any(m == "torchtitan" or m.startswith("torchtitan.") for m in sys.modules):
        raise RuntimeError("qwen3exp: the CUDA platform must be prepared before torchtitan is imported")
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(f"qwen3exp: torch.cuda.is_available() is False in this rank (torch {torch.__version__}, "
                           f"CUDA {torch.version.cuda}, "
                           f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    # One visible GPU per process (a per-rank CUDA_VISIBLE_DEVICES mask) is fine: torchtitan uses index 0.
    if torch.cuda.device_count() != 1 and torch.cuda.device_count() < local_world:
        raise RuntimeError(f"qwen3exp: {local_world} ranks on this node but only "
                           f"{torch.cuda.device_count()} visible GPU(s)")

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

import glob
import os
import sys
from typing import Any

from qwen3exp.config.sections.platform import CudaPlatform
from qwen3exp.errors import ConfigError, Problem
from qwen3exp.platforms import probe
from qwen3exp.platforms.variant import ALLOWED, SUSTAINED_FRACTION_OF_PEAK, PeakFlops, PlatformFacts, section_name
from qwen3exp.units import GIB

SECTION = CudaPlatform
NAME = section_name(SECTION)

# parallelism=auto's cost model (`qwen3exp.plan.layout_cost`) on GPUs: an H100 SXM node, the 80 GiB
# GPU that platform.assumed_memory_gib plans for. Stated by NVIDIA's H100 datasheet: 989 TFLOP/s dense
# BF16 (also torchtitan's peak-FLOPs table for H100 SXM), NVLink 900 GB/s per GPU (both directions,
# so 450 GB/s sent), and a DGX H100 node's eight 400 Gb/s NDR InfiniBand ports: 50 GB/s per GPU.
ASSUMED_PEAK_FLOPS = 989e12
"""Peak BF16 FLOP/s per GPU when no GPU was probed (a dry run elsewhere)."""
NVLINK_BYTES_PER_S = 450e9
NETWORK_BYTES_PER_S = 50e9


def device_hint() -> str | None:
    """Why a CUDA GPU may be present, or None when there is surely none (no torch import)."""
    devices = sorted(glob.glob("/dev/nvidia[0-9]*"))
    if devices:
        return f"{devices[0]} exists"
    if glob.glob("/proc/driver/nvidia/gpus/*"):
        return "the NVIDIA driver lists GPUs"
    return None


def facts(cfg, *, nproc_per_node: int | None, dry_run: bool, reason: str, here: bool = True) -> PlatformFacts:
    hint = device_hint() if here else None  # here=False: the job's GPUs, elsewhere (`platforms.elsewhere`)
    info: dict[str, Any] = probe.probe(NAME) if hint else {"error": "no /dev/nvidia* device" if here else "elsewhere"}
    count = int(info.get("count") or 0) if info.get("available") else 0
    if count:
        checked = True
        ranks = cfg.gpus_per_node or count
        memory = int(cfg.memory_per_gpu_gib * GIB) if cfg.memory_per_gpu_gib else int(info["total_memory"])
        name, peak = info.get("name"), info.get("peak_flops")
        reason += f"; {count} GPU(s) checked ({name})"
        if ranks > count:
            raise ConfigError(
                [
                    Problem(
                        "platform.gpus_per_node",
                        cfg.gpus_per_node,
                        f"more ranks than visible GPUs ({count})",
                        f"1..{count}",
                    )
                ]
            )
    elif dry_run:
        checked, name, peak = False, None, None
        ranks = cfg.gpus_per_node or cfg.assumed_gpus_per_node
        memory = int((cfg.memory_per_gpu_gib or cfg.assumed_memory_gib) * GIB)
        reason += (
            f"; device not checked (dry run, {info.get('error') or 'no CUDA GPU visible'}): planned with "
            f"{ranks} GPU(s) of {memory / GIB:.0f} GiB"
        )
    else:
        raise ConfigError(
            [
                Problem(
                    "platform",
                    NAME,
                    f"no CUDA GPU is usable here ({info.get('error') or 'torch.cuda.is_available() is False'})",
                    ALLOWED,
                    "use platform=auto or platform=cpu here; dry_run=true plans a GPU run without one",
                )
            ]
        )
    return PlatformFacts(
        name=NAME,
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
        sustained_flops_per_rank=(peak or ASSUMED_PEAK_FLOPS) * SUSTAINED_FRACTION_OF_PEAK,
        link_bytes_per_s=NVLINK_BYTES_PER_S,
        network_bytes_per_s=NETWORK_BYTES_PER_S,
    )


def detect(*, nproc_per_node: int | None, dry_run: bool) -> PlatformFacts | str:
    """platform=auto: a GPU torch sees (probed), or why there is none."""
    hint = device_hint()
    if hint is None:
        return "no CUDA GPU (no /dev/nvidia* device)"
    info = probe.probe(NAME)
    if info.get("available") and info.get("count", 0) > 0:
        return facts(
            SECTION(),
            nproc_per_node=nproc_per_node,
            dry_run=dry_run,
            reason=f"platform=auto: {info['count']} CUDA GPU(s) visible ({info.get('name')})",
        )
    return f"{hint} but torch sees no CUDA GPU ({info.get('error') or 'torch.cuda.is_available() is False'})"


def experiment_problems(exp, facts: PlatformFacts) -> list[Problem]:
    return []  # torchtitan's home ground: FlexAttention and the inductor backend work here


def launch_problems(
    exp, facts: PlatformFacts, *, ranks: int, plan_bytes_per_rank: int | None, total_params: int = 0
) -> list[Problem]:
    return []  # a GPU's memory is the device's, checked by the plan


RESERVED_FRACTION = 0.10
"""What the caching allocator reserves beyond the model's step peak (freed blocks it keeps,
fragmentation), as torch.cuda.max_memory_reserved counts it: an assumption (no GPU has measured it
here yet); tests/gpu/bench_memory_cuda.sh measures it. The CUDA context is outside the measure."""


def measured_beside(exp) -> tuple[int, float]:
    """(runtime bytes, retained fraction) beside the model's step peak in what a rank measures
    (max_memory_reserved): no runtime, the allocator's reserve."""
    return 0, RESERVED_FRACTION


def device_names() -> list[str]:
    import torch  # lazy: only when a CUDA run records its provenance

    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def probe_device(peak_flops: PeakFlops) -> dict:
    """The probe process's answer (see `probe`): whether torch sees GPUs, how many, the first one's
    name and memory, and the peak FLOPs torchtitan uses for MFU."""
    out: dict = {
        "kind": NAME,
        "available": False,
        "count": 0,
        "name": None,
        "total_memory": None,
        "peak_flops": None,
        "torch_cuda": None,
        "error": None,
    }
    import torch  # lazy: only in the probe process

    out["torch_cuda"] = torch.version.cuda
    if torch.version.cuda is None:
        out["error"] = f"torch {torch.__version__} was built without CUDA"
        return out
    out["available"] = torch.cuda.is_available()
    if not out["available"]:
        return out
    out["count"] = torch.cuda.device_count()
    props = torch.cuda.get_device_properties(0)
    out["name"], out["total_memory"] = props.name, int(props.total_memory)
    try:  # the peak torchtitan itself uses for MFU
        out["peak_flops"] = float(peak_flops(props.name))
    except Exception as e:  # noqa: BLE001 - MFU is optional; say why it is missing
        out["error"] = f"no peak FLOPs for MFU: {type(e).__name__}: {e}"
    return out


def prepare_worker(facts: PlatformFacts) -> None:
    """Check, in each rank before torchtitan is imported, that CUDA is usable and has a GPU for
    every local rank; torchtitan then takes over with its defaults."""
    if any(m == "torchtitan" or m.startswith("torchtitan.") for m in sys.modules):
        raise RuntimeError("qwen3exp: the CUDA platform must be prepared before torchtitan is imported")
    import torch  # lazy: torch loads only in the ranks

    if not torch.cuda.is_available():
        raise RuntimeError(
            f"qwen3exp: torch.cuda.is_available() is False in this rank (torch {torch.__version__}, "
            f"CUDA {torch.version.cuda}, "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
        )
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    # One visible GPU per process (a per-rank CUDA_VISIBLE_DEVICES mask) is fine: torchtitan uses index 0.
    if torch.cuda.device_count() != 1 and torch.cuda.device_count() < local_world:
        raise RuntimeError(
            f"qwen3exp: {local_world} ranks on this node but only {torch.cuda.device_count()} visible GPU(s)"
        )

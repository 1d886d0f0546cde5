"""Neuron platform: AWS Trainium through TorchNeuron (`torch-neuronx` 2.13/2.14 "native").

NOT RUN ON HARDWARE. No Trainium machine was reachable while this was written, and the Neuron
packages cannot be installed here (PyPI's `torch-neuronx` is a placeholder). This module is written
against TorchNeuron's documented API and covered by contract tests that install a fake
`torch_neuronx` (tests/fakes/); everything that imports the real packages sits behind the import
check in `prepare_worker` and the probe (both in `neuron_device`, the side where torch is imported).

Each adaptation states the behaviour it answers:
1. Device. TorchNeuron registers the PrivateUse1 device as `neuron` with a `torch.neuron` module
   (CUDA-like API: device_count, get_device_properties, memory_stats, ...) when torch_neuronx is
   imported (autoloaded on `import torch`). torchtitan binds `device_type` at import from
   `torch._utils._get_available_device_type()`; `prepare_worker` imports torch_neuronx explicitly
   (autoload can be off: TORCH_DEVICE_BACKEND_AUTOLOAD=0) and pins that answer to `neuron` before
   torchtitan is imported.
2. Distributed backend. torchtitan picks `default_device_backend_map[device_type]` and falls back to
   nccl; `prepare_worker` maps `neuron` to the `neuron` process-group backend registered by
   torch_neuronx, and fails clearly if torch_neuronx registered none.
3. Attention. FlexAttention has only an inductor lowering and torchtitan refuses to compile it with
   any other backend: Neuron uses qwen3exp's SDPA (`qwen3exp.titan.attention`: a dense document
   mask, or `is_causal` where no document boundary needs one, `qwen3exp.plan.attention_path`).
4. Compilation. `training.compile=true` compiles with the `neuron` dynamo backend (TorchNeuron
   supports mode "default" and no `dynamic=True`; torchtitan passes neither).
5. Ranks. One rank per logical NeuronCore: NEURON_LOGICAL_NC_CONFIG (platform.lnc, default 2 on
   trn2) groups physical cores; a trn2.48xlarge shows 64 logical cores at LNC=2. A real launch
   probes the device count with that setting and refuses a disagreement; a dry run plans with the
   instance table (`qwen3exp.config.sections.platform.INSTANCES`) and says the device was not checked.
6. Processes. A forked child cannot re-initialise the Neuron runtime: torchrun starts fresh
   processes, and `prepare_worker` sets the multiprocessing start method to spawn for anything a
   rank starts itself (data-loader workers).
7. Compile cache. Compiled graphs (NEFFs) go to TORCH_NEURONX_NEFF_CACHE_DIR: by default one folder
   per graph in a cache shared by every run and sweep job, or platform.compile_cache_dir
   (`qwen3exp.platforms.neuron_cache`).
8. Timeouts. The first step compiles every graph (minutes for a 4B model); ranks that finish
   compiling at different times wait in the first collectives, so the init/first-step collective
   timeout is raised to 30 minutes (torchtitan's default is 5).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from qwen3exp.config.sections.platform import INSTANCES, NeuronPlatform
from qwen3exp.errors import ConfigError, Problem
from qwen3exp.platforms import neuron_cache, probe
from qwen3exp.platforms.host import machine
from qwen3exp.platforms.neuron_device import (  # prepare_worker, probe_device: the protocol's, where torch is
    INSTALL_HINT,
    LNC_ENV,
    prepare_worker as prepare_worker,
    probe_device as probe_device,
)
from qwen3exp.platforms.variant import ALLOWED, SUSTAINED_FRACTION_OF_PEAK, PlatformFacts, section_name
from qwen3exp.units import GIB

SECTION = NeuronPlatform
NAME = section_name(SECTION)

COMM_INIT_TIMEOUT_S = 1800

# parallelism=auto's cost model (`qwen3exp.plan.layout_cost`) on Trainium2. NOT MEASURED (no Trainium
# here): AWS's Neuron documentation, "Trainium2 Architecture", states NeuronLink-v3 at 1.28 TB/s per
# chip (taken as both directions, so 640 GB/s sent per chip, shared by the chip's ranks); AWS's Trn2
# instance page states 3.2 Tb/s of EFAv3 networking per trn2.48xlarge (16 chips), taken here as 25 GB/s
# per chip for every instance type. The compute rate is the table's peak (torchtitan's 79 TFLOP/s per
# NeuronCore-v3) times `SUSTAINED_FRACTION_OF_PEAK`.
NEURONLINK_BYTES_PER_CHIP = 0.64e12
EFA_BYTES_PER_CHIP = 3.2e12 / 8 / 16


def device_hint() -> str | None:
    """Why a Neuron device may be usable, or None when torch_neuronx is not installed (no import)."""
    try:
        found = importlib.util.find_spec("torch_neuronx") is not None
    except (ImportError, ValueError):
        found = False
    return "torch_neuronx is installed" if found else None


def probe_env(cfg) -> dict[str, str]:
    """The Neuron variables every rank (and the device probe) gets."""
    return {LNC_ENV: str(cfg.lnc), **cfg.runtime_env}


def _check_lnc_env(cfg) -> None:
    """A NEURON_LOGICAL_NC_CONFIG already set in the shell must agree with platform.lnc: the
    compiler and the runtime must use one LNC, and silently overriding the user's setting hides it."""
    current = os.environ.get(LNC_ENV)
    if current is not None and current != str(cfg.lnc):
        raise ConfigError(
            [
                Problem(
                    "platform.lnc",
                    cfg.lnc,
                    f"disagrees with {LNC_ENV}={current} in your environment",
                    "1, 2",
                    f"set platform.lnc={current}, or unset {LNC_ENV}",
                )
            ]
        )


def facts(cfg, *, nproc_per_node: int | None, dry_run: bool, reason: str) -> PlatformFacts:
    inst = INSTANCES[cfg.instance_type]
    _check_lnc_env(cfg)
    table = inst.logical_cores(cfg.lnc)
    expected = cfg.cores_per_node or table
    source = (
        "platform.cores_per_node"
        if cfg.cores_per_node
        else f"{cfg.instance_type}: {inst.chips} chip(s) x {inst.physical_cores_per_chip} cores / LNC {cfg.lnc}"
    )
    env = probe_env(cfg)
    cache_env, run_dir_env = neuron_cache.platform_env(cfg, os.environ)
    env.update(cache_env)
    name, total_memory = inst.device_name, None
    if dry_run:
        checked = False
        reason += f"; device not checked (dry run): planned with {expected} logical cores ({source})"
    else:
        # Not installed at all: say so without spending seconds on a probe that imports torch.
        info = probe.probe(NAME, env) if device_hint() else {"error": "No module named 'torch_neuronx'"}
        _require_device(cfg, info, expected, source)
        checked, name, total_memory = True, info.get("name") or name, info.get("total_memory")
        reason += (
            f"; {info['count']} logical NeuronCores at LNC={cfg.lnc} checked (torch-neuronx {info.get('version')})"
        )
    if cfg.hbm_per_core_gib:
        memory = int(cfg.hbm_per_core_gib * GIB)
    elif total_memory:
        memory = int(total_memory)
    else:
        memory = int(inst.hbm_per_logical_core_gib(cfg.lnc) * GIB)
    return PlatformFacts(
        name=NAME,
        reason=reason,
        device_type="neuron",
        dist_backend="neuron",
        ranks_per_node=expected,
        memory_per_rank_bytes=memory,
        attention="sdpa",
        compile_backend="neuron",
        peak_flops_per_rank=inst.bf16_flops_per_physical_core * cfg.lnc,
        env=env,
        device_name=name,
        device_checked=checked,
        devices_per_node=expected,  # one rank per logical core: the plan refuses more ranks
        devices_exclusive=True,
        lnc=cfg.lnc,
        run_dir_env=run_dir_env,
        comm_init_timeout_s=COMM_INIT_TIMEOUT_S,
        sustained_flops_per_rank=inst.bf16_flops_per_physical_core * cfg.lnc * SUSTAINED_FRACTION_OF_PEAK,
        link_bytes_per_s=NEURONLINK_BYTES_PER_CHIP * cfg.lnc / inst.physical_cores_per_chip,
        network_bytes_per_s=EFA_BYTES_PER_CHIP * cfg.lnc / inst.physical_cores_per_chip,
    )


def _require_device(cfg, info: dict, expected: int, source: str) -> None:
    """The preflight of a real launch: torch_neuronx imports, NeuronCores are visible, and their
    number agrees with the LNC setting."""
    if not info.get("importable"):
        raise ConfigError(
            [
                Problem(
                    "platform",
                    NAME,
                    f"torch_neuronx cannot be imported ({info.get('error') or 'not installed'})",
                    ALLOWED,
                    INSTALL_HINT,
                )
            ]
        )
    count = int(info.get("count") or 0)
    if not info.get("available") or count == 0:
        raise ConfigError(
            [
                Problem(
                    "platform",
                    NAME,
                    f"torch_neuronx {info.get('version')} imports but no NeuronCore is visible"
                    + (f" ({info['error']})" if info.get("error") else ""),
                    ALLOWED,
                    "check the Neuron driver and runtime with neuron-ls; NEURON_RT_VISIBLE_CORES or "
                    "NEURON_RT_NUM_CORES in platform.runtime_env restrict what a process sees",
                )
            ]
        )
    if count != expected:
        other = {lnc: INSTANCES[cfg.instance_type].logical_cores(lnc) for lnc in (1, 2) if lnc != cfg.lnc}
        hint = next(
            (
                f"{count} logical cores is what LNC={lnc} gives on {cfg.instance_type}: "
                f"set platform.lnc={lnc}, or check {LNC_ENV} in the runtime"
                for lnc, n in other.items()
                if n == count
            ),
            None,
        )
        raise ConfigError(
            [
                Problem(
                    "platform.lnc",
                    cfg.lnc,
                    f"the LNC setting disagrees with the device count: expected {expected} logical NeuronCores "
                    f"({source}), the runtime shows {count} with {LNC_ENV}={cfg.lnc}",
                    "1, 2",
                    hint
                    or "on another instance type set platform.instance_type, or platform.cores_per_node "
                    f"to the number of logical cores (here {count})",
                )
            ]
        )


def detect(*, nproc_per_node: int | None, dry_run: bool) -> PlatformFacts | str:
    """platform=auto: NeuronCores torch_neuronx sees (a dry run: torch_neuronx installed), or why not."""
    hint = device_hint()
    if hint is None:
        return "torch_neuronx is not installed"
    if dry_run:
        return facts(SECTION(), nproc_per_node=nproc_per_node, dry_run=True, reason=f"platform=auto: {hint}")
    cfg = SECTION()
    info = probe.probe(NAME, probe_env(cfg))
    if info.get("importable") and info.get("available") and info.get("count", 0) > 0:
        return facts(
            cfg,
            nproc_per_node=nproc_per_node,
            dry_run=False,
            reason=f"platform=auto: {info['count']} NeuronCore(s) visible ({info.get('name')})",
        )
    return f"{hint} but no NeuronCore is usable ({info.get('error') or 'torch.neuron.is_available() is False'})"


def experiment_problems(exp, facts: PlatformFacts) -> list[Problem]:
    if exp.model.attention == "flex":  # every model backend has `attention`
        return [
            Problem(
                "model.attention",
                "flex",
                "FlexAttention is not available on Neuron (it has only an "
                "inductor lowering; torchtitan refuses to compile it with backend 'neuron')",
                "auto, sdpa",
            )
        ]
    return []


def launch_problems(
    exp, facts: PlatformFacts, *, ranks: int, plan_bytes_per_rank: int | None, total_params: int = 0
) -> list[Problem]:
    return []  # NeuronCore memory is the device's, checked by the plan


def measured_beside(exp) -> tuple[int, float]:
    """(runtime bytes, retained fraction) beside the model's step peak in what a rank measures: not
    measured on Trainium yet, so the model's step peak alone."""
    return 0, 0.0


def device_names() -> list[str]:
    # One /dev/neuronN per Neuron device; the instance type names the chip generation.
    devices = sorted(p.name for p in Path("/dev").glob("neuron[0-9]*"))
    return [f"{machine() or 'neuron'}: {d}" for d in devices]

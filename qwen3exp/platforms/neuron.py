"""Neuron platform: AWS Trainium through TorchNeuron (`torch-neuronx` 2.13/2.14 "native").

NOT RUN ON HARDWARE. No Trainium machine was reachable while this was written, and the Neuron
packages cannot be installed here (PyPI's `torch-neuronx` is a placeholder). This module is written
against TorchNeuron's documented API and covered by contract tests that install a fake
`torch_neuronx` (tests/fakes/); everything that imports the real packages sits behind the import
check in `prepare_worker` and the probe.

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
   any other backend: Neuron uses qwen3exp's document-masked SDPA (`qwen3exp.titan.attention`).
4. Compilation. `training.compile=true` compiles with the `neuron` dynamo backend (TorchNeuron
   supports mode "default" and no `dynamic=True`; torchtitan passes neither).
5. Ranks. One rank per logical NeuronCore: NEURON_LOGICAL_NC_CONFIG (platform.lnc, default 2 on
   trn2) groups physical cores; a trn2.48xlarge shows 64 logical cores at LNC=2. A real launch
   probes the device count with that setting and refuses a disagreement; a dry run plans with the
   instance table (`qwen3exp.config.schema.INSTANCES`) and says the device was not checked.
6. Processes. A forked child cannot re-initialise the Neuron runtime: torchrun starts fresh
   processes, and `prepare_worker` sets the multiprocessing start method to spawn for anything a
   rank starts itself (data-loader workers).
7. Compile cache. Compiled graphs (NEFFs) go to TORCH_NEURONX_NEFF_CACHE_DIR: neuron_cache/ in the
   run directory, or platform.compile_cache_dir (a shared folder avoids recompiling every run).
8. Timeouts. The first step compiles every graph (minutes for a 4B model); ranks that finish
   compiling at different times wait in the first collectives, so the init/first-step collective
   timeout is raised to 30 minutes (torchtitan's default is 5).
"""

from __future__ import annotations

import os
import sys

from qwen3exp.config.schema import INSTANCES
from qwen3exp.errors import ConfigError, Problem
from qwen3exp.platforms import PlatformFacts
from qwen3exp.units import GIB

LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
CACHE_ENV = "TORCH_NEURONX_NEFF_CACHE_DIR"
RUN_DIR_CACHE = "neuron_cache"
COMM_INIT_TIMEOUT_S = 1800

# The CUDA-like functions torchtitan 0.3.0 calls on its device module.
DEVICE_MODULE_API = ("is_available", "device_count", "set_device", "current_device", "get_device_name",
                     "get_device_properties", "memory_stats", "reset_peak_memory_stats", "empty_cache",
                     "synchronize")

INSTALL_HINT = (
    "install TorchNeuron from the Neuron pip repository (PyPI's torch-neuronx is a placeholder), "
    "in a Python 3.12+ environment with PyTorch 2.14:\n"
    "        python -m pip install \"torch-neuronx==2.14.*\" \"neuronx-cc==2.*\" nki "
    "--extra-index-url https://pip.repos.neuron.amazonaws.com --extra-index-url https://download.pytorch.org/whl/cpu\n"
    "      (or use an AWS Neuron Deep Learning AMI / container), then check with\n"
    "        python -c \"import torch, torch_neuronx; print(torch.neuron.device_count())\"\n"
    "      To plan without a Trainium machine, add dry_run=true."
)


def probe_env(cfg) -> dict[str, str]:
    """The Neuron variables every rank (and the device probe) gets."""
    return {LNC_ENV: str(cfg.lnc), **cfg.runtime_env}


def _check_lnc_env(cfg) -> None:
    """A NEURON_LOGICAL_NC_CONFIG already set in the shell must agree with platform.lnc: the
    compiler and the runtime must use one LNC, and silently overriding the user's setting hides it."""
    current = os.environ.get(LNC_ENV)
    if current is not None and current != str(cfg.lnc):
        raise ConfigError([Problem(
            "platform.lnc", cfg.lnc, f"disagrees with {LNC_ENV}={current} in your environment",
            "1, 2", f"set platform.lnc={current}, or unset {LNC_ENV}")])


def facts(cfg, *, nproc_per_node: int | None, dry_run: bool, reason: str) -> PlatformFacts:
    inst = INSTANCES[cfg.instance_type]
    _check_lnc_env(cfg)
    table = inst.logical_cores(cfg.lnc)
    expected = cfg.cores_per_node or table
    source = ("platform.cores_per_node" if cfg.cores_per_node else
              f"{cfg.instance_type}: {inst.chips} chip(s) x {inst.physical_cores_per_chip} cores / LNC {cfg.lnc}")
    env = probe_env(cfg)
    run_dir_env: dict[str, str] = {}
    if cfg.compile_cache_dir:
        env[CACHE_ENV] = os.path.abspath(os.path.expanduser(cfg.compile_cache_dir))
    else:
        run_dir_env[CACHE_ENV] = RUN_DIR_CACHE
    name, total_memory = inst.device_name, None
    if dry_run:
        checked = False
        reason += f"; device not checked (dry run): planned with {expected} logical cores ({source})"
    else:
        from qwen3exp.platforms import probe

        # Not installed at all: say so without spending seconds on a probe that imports torch.
        info = probe.probe("neuron", env) if probe.neuron_hint() else {"error": "No module named 'torch_neuronx'"}
        _require_device(cfg, info, expected, source)
        checked, name, total_memory = True, info.get("name") or name, info.get("total_memory")
        reason += (f"; {info['count']} logical NeuronCores at LNC={cfg.lnc} checked "
                   f"(torch-neuronx {info.get('version')})")
    if cfg.hbm_per_core_gib:
        memory = int(cfg.hbm_per_core_gib * GIB)
    elif total_memory:
        memory = int(total_memory)
    else:
        memory = int(inst.hbm_per_logical_core_gib(cfg.lnc) * GIB)
    return PlatformFacts(
        name="neuron",
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
    )


def _require_device(cfg, info: dict, expected: int, source: str) -> None:
    """The preflight of a real launch: torch_neuronx imports, NeuronCores are visible, and their
    number agrees with the LNC setting."""
    if not info.get("importable"):
        raise ConfigError([Problem(
            "platform", "neuron", f"torch_neuronx cannot be imported ({info.get('error') or 'not installed'})",
            "auto, cpu, cuda, neuron", INSTALL_HINT)])
    count = int(info.get("count") or 0)
    if not info.get("available") or count == 0:
        raise ConfigError([Problem(
            "platform", "neuron",
            f"torch_neuronx {info.get('version')} imports but no NeuronCore is visible"
            + (f" ({info['error']})" if info.get("error") else ""),
            "auto, cpu, cuda, neuron",
            "check the Neuron driver and runtime with neuron-ls; NEURON_RT_VISIBLE_CORES or "
            "NEURON_RT_NUM_CORES in platform.runtime_env restrict what a process sees")])
    if count != expected:
        other = {lnc: INSTANCES[cfg.instance_type].logical_cores(lnc) for lnc in (1, 2) if lnc != cfg.lnc}
        hint = next((f"{count} logical cores is what LNC={lnc} gives on {cfg.instance_type}: "
                     f"set platform.lnc={lnc}, or check {LNC_ENV} in the runtime" for lnc, n in other.items()
                     if n == count), None)
        raise ConfigError([Problem(
            "platform.lnc", cfg.lnc,
            f"the LNC setting disagrees with the device count: expected {expected} logical NeuronCores "
            f"({source}), the runtime shows {count} with {LNC_ENV}={cfg.lnc}", "1, 2",
            hint or "on another instance type set platform.instance_type, or platform.cores_per_node "
                    f"to the number of logical cores (here {count})")])


# ----------------------------------------------------------------------------- worker side
def prepare_worker(facts: PlatformFacts) -> None:
    """In each rank, before torchtitan is imported: import torch_neuronx, check the device and the
    LNC the runtime got, make torchtitan pick device `neuron` and process-group backend `neuron`."""
    if any(m == "torchtitan" or m.startswith("torchtitan.") for m in sys.modules):
        raise RuntimeError("qwen3exp: the Neuron platform must be prepared before torchtitan is imported")
    lnc = os.environ.get(LNC_ENV)
    if facts.lnc is not None and lnc != str(facts.lnc):
        raise RuntimeError(f"qwen3exp: this rank has {LNC_ENV}={lnc!r} but the run was planned with LNC={facts.lnc}")
    import torch

    try:
        import torch_neuronx  # noqa: F401 - registers the neuron device, torch.neuron and the backend
    except Exception as e:  # noqa: BLE001 - ImportError, or PyPI's placeholder raising at import
        raise RuntimeError(f"qwen3exp: torch_neuronx cannot be imported ({type(e).__name__}: {e}); "
                           + INSTALL_HINT) from e
    if torch._C._get_privateuse1_backend_name() != "neuron" or not hasattr(torch, "neuron"):
        raise RuntimeError("qwen3exp: torch_neuronx imported but did not register the 'neuron' device "
                           f"(PrivateUse1 is {torch._C._get_privateuse1_backend_name()!r})")
    module = torch.neuron
    missing = [f for f in DEVICE_MODULE_API if not hasattr(module, f)]
    if missing:
        raise RuntimeError(f"qwen3exp: torch.neuron lacks {', '.join(missing)}, which torchtitan calls")
    if not module.is_available():
        raise RuntimeError("qwen3exp: torch.neuron.is_available() is False in this rank")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    count = module.device_count()
    # One visible core per process (a per-rank NEURON_RT_VISIBLE_CORES mask) is fine: torchtitan uses index 0.
    if count != 1 and count < local_world:
        raise RuntimeError(f"qwen3exp: {local_world} ranks on this node but torch.neuron.device_count() is {count}")

    import torch._utils
    import torch.distributed as dist

    # torchtitan binds its device at import from this function (cuda first): pin it to neuron.
    torch._utils._get_available_device_type = lambda: "neuron"
    if getattr(dist.Backend, facts.dist_backend.upper(), None) is None:
        raise RuntimeError(f"qwen3exp: torch_neuronx did not register the {facts.dist_backend!r} "
                           "process-group backend")
    # torchtitan asks this map for the device's backend and falls back to nccl when it is missing.
    dist.Backend.default_device_backend_map[facts.device_type] = facts.dist_backend

    import multiprocessing

    # A forked child cannot re-initialise the Neuron runtime.
    multiprocessing.set_start_method("spawn", force=True)

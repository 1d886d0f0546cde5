"""The Neuron platform where torch is imported: the rank's preparation (adaptations 1, 2 and 6 of
`qwen3exp.platforms.neuron`) and the device probe's body. NOT RUN ON HARDWARE (see there)."""

from __future__ import annotations

import multiprocessing
import os
import sys

from qwen3exp.platforms.variant import PeakFlops, PlatformFacts

LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"

# The CUDA-like functions torchtitan 0.3.0 calls on its device module.
DEVICE_MODULE_API = (
    "is_available",
    "device_count",
    "set_device",
    "current_device",
    "get_device_name",
    "get_device_properties",
    "memory_stats",
    "reset_peak_memory_stats",
    "empty_cache",
    "synchronize",
)

INSTALL_HINT = (
    "install TorchNeuron from the Neuron pip repository (PyPI's torch-neuronx is a placeholder), "
    "in a Python 3.12+ environment with PyTorch 2.14:\n"
    '        python -m pip install "torch-neuronx==2.14.*" "neuronx-cc==2.*" nki '
    "--extra-index-url https://pip.repos.neuron.amazonaws.com --extra-index-url https://download.pytorch.org/whl/cpu\n"
    "      (or use an AWS Neuron Deep Learning AMI / container), then check with\n"
    '        python -c "import torch, torch_neuronx; print(torch.neuron.device_count())"\n'
    "      To plan without a Trainium machine, add dry_run=true."
)


def probe_device(peak_flops: PeakFlops) -> dict:
    """The probe process's answer (see `probe`): whether torch_neuronx imports, its version, and the
    logical NeuronCores it shows with this process's NEURON_LOGICAL_NC_CONFIG."""
    out: dict = {
        "kind": "neuron",
        "importable": False,
        "version": None,
        "available": False,
        "count": 0,
        "name": None,
        "total_memory": None,
        "lnc_env": os.environ.get(LNC_ENV),
        "error": None,
    }
    try:
        import torch  # lazy: only in the probe process
        import torch_neuronx  # lazy: the same
    except Exception as e:  # noqa: BLE001 - ImportError, or PyPI's placeholder raising "WRONG PACKAGE"
        out["error"] = f"{type(e).__name__}: {e}"
        return out
    out["importable"] = True
    out["version"] = getattr(torch_neuronx, "__version__", None)
    module = getattr(torch, "neuron", None)
    if module is None:
        out["error"] = "torch_neuronx imported, but torch.neuron does not exist"
        return out
    try:
        out["available"] = bool(module.is_available())
        if out["available"]:
            out["count"] = int(module.device_count())
            props = module.get_device_properties(0)
            out["name"] = getattr(props, "name", None)
            total = getattr(props, "total_memory", None)
            out["total_memory"] = int(total) if total else None
    except Exception as e:  # noqa: BLE001 - report, the launcher turns it into a clear error
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def prepare_worker(facts: PlatformFacts) -> None:
    """In each rank, before torchtitan is imported: import torch_neuronx, check the device and the
    LNC the runtime got, make torchtitan pick device `neuron` and process-group backend `neuron`."""
    if any(m == "torchtitan" or m.startswith("torchtitan.") for m in sys.modules):
        raise RuntimeError("qwen3exp: the Neuron platform must be prepared before torchtitan is imported")
    lnc = os.environ.get(LNC_ENV)
    if facts.lnc is not None and lnc != str(facts.lnc):
        raise RuntimeError(f"qwen3exp: this rank has {LNC_ENV}={lnc!r} but the run was planned with LNC={facts.lnc}")
    import torch  # lazy: torch loads only in the ranks

    try:
        import torch_neuronx  # noqa: F401  # lazy: registers the neuron device, torch.neuron and the backend
    except Exception as e:  # noqa: BLE001 - ImportError, or PyPI's placeholder raising at import
        raise RuntimeError(
            f"qwen3exp: torch_neuronx cannot be imported ({type(e).__name__}: {e}); " + INSTALL_HINT
        ) from e
    if torch._C._get_privateuse1_backend_name() != "neuron" or not hasattr(torch, "neuron"):
        raise RuntimeError(
            "qwen3exp: torch_neuronx imported but did not register the 'neuron' device "
            f"(PrivateUse1 is {torch._C._get_privateuse1_backend_name()!r})"
        )
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

    import torch._utils  # lazy: the same
    import torch.distributed as dist  # lazy: the same

    # torchtitan binds its device at import from this function (cuda first): pin it to neuron.
    torch._utils._get_available_device_type = lambda: "neuron"
    if getattr(dist.Backend, facts.dist_backend.upper(), None) is None:
        raise RuntimeError(f"qwen3exp: torch_neuronx did not register the {facts.dist_backend!r} process-group backend")
    # torchtitan asks this map for the device's backend and falls back to nccl when it is missing.
    dist.Backend.default_device_backend_map[facts.device_type] = facts.dist_backend

    # A forked child cannot re-initialise the Neuron runtime.
    multiprocessing.set_start_method("spawn", force=True)

"""Finding devices: cheap hints (no torch import) and a short-lived probe subprocess.

The launcher asks `cuda_hint()` / `neuron_hint()` first, which only look at the file system and the
installed packages, so on a machine without accelerators nothing heavy runs. Where a device may
exist, `probe(kind, env)` runs `python -m qwen3exp.platforms.probe KIND` and reads one JSON line.

Why a subprocess and not a call in the launcher: the launcher must hold no device state while its
ranks run. `torch.cuda.get_device_properties` creates a CUDA context on GPU 0 (hundreds of MiB kept
for the whole run), and a Neuron runtime initialised in the launcher could keep NeuronCores that the
ranks need. The probe gets the ranks' environment (NEURON_LOGICAL_NC_CONFIG, runtime variables), so
it sees the devices as the ranks will.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

PROBE_TIMEOUT_S = 300.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def cuda_hint() -> str | None:
    """Why a CUDA GPU may be present, or None when there is surely none (no torch import)."""
    devices = sorted(glob.glob("/dev/nvidia[0-9]*"))
    if devices:
        return f"{devices[0]} exists"
    if glob.glob("/proc/driver/nvidia/gpus/*"):
        return "the NVIDIA driver lists GPUs"
    return None


def neuron_hint() -> str | None:
    """Why a Neuron device may be usable, or None when torch_neuronx is not installed."""
    try:
        found = importlib.util.find_spec("torch_neuronx") is not None
    except (ImportError, ValueError):
        found = False
    return "torch_neuronx is installed" if found else None


_cache: dict[tuple, dict] = {}


def probe(kind: str, env: dict[str, str] | None = None) -> dict:
    """Run the probe subprocess for `kind` (cuda | neuron) with `env` added to this environment.
    Results are cached per kind and environment for the life of the launcher process."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, full_env.get("PYTHONPATH")) if p)
    key = (kind, tuple(sorted(full_env.items())))
    if key in _cache:
        return _cache[key]
    try:
        proc = subprocess.run([sys.executable, "-m", "qwen3exp.platforms.probe", kind], env=full_env,
                              capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        result = json.loads(lines[-1]) if lines else {
            "error": f"the {kind} probe exited with code {proc.returncode}: "
                     f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}"}
    except subprocess.TimeoutExpired:
        result = {"error": f"the {kind} probe did not answer within {PROBE_TIMEOUT_S:.0f} s"}
    _cache[key] = result
    return result


# ------------------------------------------------------------------ the probe process itself
def _probe_cuda() -> dict:
    out: dict = {"kind": "cuda", "available": False, "count": 0, "name": None, "total_memory": None,
                 "peak_flops": None, "torch_cuda": None, "error": None}
    import torch

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
        from torchtitan.tools.utils import get_peak_flops

        out["peak_flops"] = float(get_peak_flops(props.name))
    except Exception as e:  # noqa: BLE001 - MFU is optional; say why it is missing
        out["error"] = f"no peak FLOPs for MFU: {type(e).__name__}: {e}"
    return out


def _probe_neuron() -> dict:
    out: dict = {"kind": "neuron", "importable": False, "version": None, "available": False, "count": 0,
                 "name": None, "total_memory": None, "lnc_env": os.environ.get("NEURON_LOGICAL_NC_CONFIG"),
                 "error": None}
    try:
        import torch
        import torch_neuronx
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


def main(argv: list[str]) -> int:
    kind = argv[0] if argv else ""
    match kind:
        case "cuda":
            result = _probe_cuda()
        case "neuron":
            result = _probe_neuron()
        case _:
            print(f"usage: python -m qwen3exp.platforms.probe cuda|neuron (got {kind!r})", file=sys.stderr)
            return 2
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The device probe process: `python -m qwen3exp.titan.device_probe cuda|neuron` prints one JSON line.

Started by `qwen3exp.platforms.probe.probe` (by module name, in a short-lived subprocess: the
launcher must hold no device state while its ranks run; see there). It lives in the torchtitan
adapter layer because the CUDA probe asks torchtitan for the peak FLOPs it uses for MFU; the Neuron
probe imports torch and torch_neuronx only.
"""

from __future__ import annotations

import json
import os
import sys


def probe_cuda() -> dict:
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


def probe_neuron() -> dict:
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
            result = probe_cuda()
        case "neuron":
            result = probe_neuron()
        case _:
            print(f"usage: python -m qwen3exp.titan.device_probe cuda|neuron (got {kind!r})", file=sys.stderr)
            return 2
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

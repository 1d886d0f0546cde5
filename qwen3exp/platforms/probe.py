"""Finding devices: cheap hints (no torch import) and a short-lived probe subprocess.

The launcher asks each platform's cheap hint first (`cuda.device_hint()`, `neuron.device_hint()`), which
only looks at the file system and the installed packages, so on a machine without accelerators
nothing heavy runs. Where a device may
exist, `probe(kind, env)` runs `python -m qwen3exp.titan.device_probe KIND` and reads one JSON line.
The probe body imports torch (and, for the peak FLOPs of MFU, torchtitan), so it lives in the
torchtitan adapter layer; this module names it by module name only and never imports it.

Why a subprocess and not a call in the launcher: the launcher must hold no device state while its
ranks run. `torch.cuda.get_device_properties` creates a CUDA context on GPU 0 (hundreds of MiB kept
for the whole run), and a Neuron runtime initialised in the launcher could keep NeuronCores that the
ranks need. The probe gets the ranks' environment (NEURON_LOGICAL_NC_CONFIG, runtime variables), so
it sees the devices as the ranks will.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROBE_TIMEOUT_S = 300.0
PROBE_MODULE = "qwen3exp.titan.device_probe"
"""Run as `python -m PROBE_MODULE KIND` (a name, not an import: no torch in this process)."""
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


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
        proc = subprocess.run(
            [sys.executable, "-m", PROBE_MODULE, kind],
            env=full_env,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        result = (
            json.loads(lines[-1])
            if lines
            else {
                "error": f"the {kind} probe exited with code {proc.returncode}: "
                f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}"
            }
        )
    except subprocess.TimeoutExpired:
        result = {"error": f"the {kind} probe did not answer within {PROBE_TIMEOUT_S:.0f} s"}
    _cache[key] = result
    return result

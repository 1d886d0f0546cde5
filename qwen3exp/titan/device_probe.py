"""The device probe process: `python -m qwen3exp.titan.device_probe cuda|neuron` prints one JSON line.

Started by `qwen3exp.platforms.probe.probe` (by module name, in a short-lived subprocess: the
launcher must hold no device state while its ranks run; see there). The platform's own module holds
the probe's body (`probe_device`, found by the platform's name); this process lives in the
torchtitan adapter layer because the CUDA probe asks torchtitan for the peak FLOPs it uses for MFU.
"""

from __future__ import annotations

import json
import sys

from qwen3exp import platforms


def peak_flops(device_name: str) -> float:
    """The peak torchtitan itself uses for MFU."""
    from torchtitan.tools.utils import get_peak_flops  # lazy: torch and torchtitan load only in the probe

    return float(get_peak_flops(device_name))


def main(argv: list[str]) -> int:
    kind = argv[0] if argv else ""
    probes = platforms.probed()
    probe = probes.get(kind)
    if probe is None:
        print(f"usage: python -m qwen3exp.titan.device_probe {'|'.join(probes)} (got {kind!r})", file=sys.stderr)
        return 2
    print(json.dumps(probe(peak_flops)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

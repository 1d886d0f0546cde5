"""A FAKE torch_neuronx for contract tests: it does on import what TorchNeuron documents (and nothing
else): rename PrivateUse1 to `neuron`, register a `torch.neuron` device module with the CUDA-like
API, and register a `neuron` process-group backend for the `neuron` device.

Its version is also in the package metadata beside it (torch_neuronx-2.14.3.0+fake.dist-info, and a
neuronx-cc one), where the launcher reads versions without importing (compile cache keys,
provenance.json); `neff_cache.py` beside it is the fake compile's cache entry.

Put `tests/fakes` on PYTHONPATH of a SUBPROCESS only: renaming PrivateUse1 cannot be undone, so it
must never happen inside the pytest process. Knobs (environment variables):
  FAKE_NEURON_PHYSICAL_CORES  physical NeuronCores on the host (default 128: a trn2.48xlarge)
  FAKE_NEURON_DEVICE_COUNT    report this many logical cores whatever the LNC (a runtime that
                              ignored NEURON_LOGICAL_NC_CONFIG)
  FAKE_NEURON_NO_BACKEND=1    do not register the process-group backend
  FAKE_NEURON_NO_DEVICE_MAP=1 register the backend without claiming the `neuron` device (so
                              default_device_backend_map lacks it, as in older releases)
  FAKE_NEURON_IMPORT_ERROR    raise this message at import (like PyPI's placeholder package)
"""

import os
from types import ModuleType, SimpleNamespace

if os.environ.get("FAKE_NEURON_IMPORT_ERROR"):
    raise RuntimeError(os.environ["FAKE_NEURON_IMPORT_ERROR"])

import torch
import torch.distributed as dist

__version__ = "2.14.3.0+fake"

_lnc = int(os.environ.get("NEURON_LOGICAL_NC_CONFIG", "2"))
_count = int(
    os.environ.get("FAKE_NEURON_DEVICE_COUNT") or int(os.environ.get("FAKE_NEURON_PHYSICAL_CORES", "128")) // _lnc
)
_GIB = 2**30
calls: list[str] = []

neuron = ModuleType("torch.neuron")
neuron.is_available = lambda: _count > 0
neuron.device_count = lambda: _count
neuron.current_device = lambda: 0
neuron.set_device = lambda device: calls.append(f"set_device({device})")
neuron.get_device_name = lambda device=None: "trn2"
neuron.get_device_properties = lambda device=None: SimpleNamespace(name="trn2", total_memory=12 * _lnc * _GIB)
neuron.memory_stats = lambda device=None: {
    "active_bytes.all.peak": 0,
    "reserved_bytes.all.peak": 0,
    "num_alloc_retries": 0,
    "num_ooms": 0,
}
neuron.reset_peak_memory_stats = lambda device=None: None
neuron.empty_cache = lambda: None
neuron.synchronize = lambda device=None: None
neuron.manual_seed = lambda seed: None
neuron.manual_seed_all = lambda seed: None

torch.utils.rename_privateuse1_backend("neuron")
torch._register_device_module("neuron", neuron)


def _create_process_group(store, rank, world_size, timeout):
    # The end of the road for a fake: report what torchtitan asked for, so a test can check it.
    raise RuntimeError(
        f"fake torch_neuronx: process group 'neuron' requested (rank {rank} of {world_size}, timeout "
        f"{timeout.total_seconds():.0f}s, NEURON_LOGICAL_NC_CONFIG={os.environ.get('NEURON_LOGICAL_NC_CONFIG')}, "
        f"TORCH_NEURONX_NEFF_CACHE_DIR={os.environ.get('TORCH_NEURONX_NEFF_CACHE_DIR')}, calls={calls})"
    )


if not os.environ.get("FAKE_NEURON_NO_BACKEND"):
    devices = None if os.environ.get("FAKE_NEURON_NO_DEVICE_MAP") else ["neuron"]
    dist.Backend.register_backend("neuron", _create_process_group, devices=devices)

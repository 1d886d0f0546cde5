"""The CPU platform inside a rank: torch made to report the CPU as torchtitan's device (adaptations
1 and 2 of `qwen3exp.platforms.cpu`), before torchtitan is imported."""

from __future__ import annotations

import functools
import sys
from types import SimpleNamespace

from qwen3exp.platforms.host import cpu_name, physical_memory
from qwen3exp.platforms.variant import PlatformFacts


class CpuDeviceModule:
    """The subset of the `torch.cuda` module API that torchtitan calls, for the CPU."""

    def __init__(self):
        import torch  # lazy: torch loads only in the ranks

        self._cpu = torch.cpu

    def __getattr__(self, name):
        return getattr(self._cpu, name)

    @staticmethod
    def _status(field: str) -> int:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith(field + ":"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def set_device(self, device) -> None:
        pass

    def current_device(self) -> int:
        return 0

    def device_count(self) -> int:
        return 1

    def get_device_name(self, device=None) -> str:
        return cpu_name()

    def get_device_properties(self, device=None):
        return SimpleNamespace(name=cpu_name(), total_memory=physical_memory())

    def memory_stats(self, device=None) -> dict[str, int]:
        peak = self._status("VmHWM")
        return {"active_bytes.all.peak": peak, "reserved_bytes.all.peak": peak, "num_alloc_retries": 0, "num_ooms": 0}

    def reset_peak_memory_stats(self, device=None) -> None:
        # Writing 5 to clear_refs resets the peak resident set size (VmHWM) of this process.
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass

    def empty_cache(self) -> None:
        pass

    def synchronize(self, device=None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        pass

    def manual_seed_all(self, seed: int) -> None:
        pass

    def is_available(self) -> bool:
        return True


def fork_ready() -> bool:
    """Whether a fork of this process can be a CPU rank or its agent: torchtitan is not imported here
    yet (`prepare_worker` can still run), or it was imported after `prepare_worker` (it bound the CPU
    device), as in a process that forks launchers and imported it ahead (tests/cli_fork_server.py)."""
    utils = sys.modules.get("torchtitan.tools.utils")
    return utils is None or isinstance(getattr(utils, "device_module", None), CpuDeviceModule)


def prepare_worker(facts: PlatformFacts) -> None:
    import torch  # lazy: torch loads only in the ranks
    import torch._utils  # lazy: the same

    if not fork_ready():
        raise RuntimeError("qwen3exp: the CPU platform must be prepared before torchtitan is imported")
    # In every rank, forked ones too, first thing on its main thread. torch rebuilds its thread pool
    # in a fork at the first call that asks for it, and two threads asking at once (the autograd
    # engine's, at the first backward) can get none: "Invalid thread pool!", SIGABRT. Asked here,
    # before any other thread exists, it is rebuilt once.
    torch.set_num_threads(int(facts.env.get("QWEN3EXP_CPU_THREADS", "1")))
    if "torchtitan.tools.utils" in sys.modules:
        return  # prepared before torchtitan was imported, by the process this one is a fork of
    module = CpuDeviceModule()
    original = torch._utils._get_device_module
    torch._utils._get_available_device_type = lambda: "cpu"

    def device_module(device_type=None):
        return module if device_type in (None, "cpu") else original(device_type)

    # Cached like torch's own (functools.lru_cache(2)), so it is the same kind of object.
    torch._utils._get_device_module = functools.lru_cache(2)(device_module)

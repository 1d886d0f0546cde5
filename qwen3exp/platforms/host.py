"""This host as the platforms see it: its CPU's name, its machine model, its memory (no torch import)."""

from __future__ import annotations

import os
import platform as _platform
from pathlib import Path


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (what can be allocated without swapping); None
    where there is no /proc (not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _platform.processor() or "cpu"


def machine() -> str | None:
    """The machine model (on EC2 the instance type, e.g. trn1.32xlarge) from DMI, when readable."""
    try:
        return Path("/sys/devices/virtual/dmi/id/product_name").read_text().strip() or None
    except OSError:
        return None

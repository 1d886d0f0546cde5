"""Byte units and their display, shared by every stage (plain Python, no imports of the package).

`gib(n)` is the fixed GiB form the memory estimate and the host checks print; `human_bytes(n)`
picks the largest unit that keeps the number at least 1 (the plan's memory table).
"""

from __future__ import annotations

KIB = 2**10
MIB = 2**20
GIB = 2**30


def gib(n: int | float) -> str:
    """`n` bytes in GiB, two decimals: `gib(3 * 2**29)` is "1.50 GiB"."""
    return f"{n / GIB:.2f} GiB"


def human_bytes(n: int | float) -> str:
    """`n` bytes in the largest of GiB / MiB / KiB that is at most |n|, two decimals; "512 B" below."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"

"""NaN and Inf in a safetensors checkpoint's values, found on the raw bytes (numpy, no torch).

A bounded scan (`SCAN_BUDGET_BYTES`): small checkpoints are read whole, large ones as the same
evenly spaced blocks of every tensor on every run (`nonfinite_tensors`).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

from qwen3exp.units import MIB

# Floating-point safetensors dtypes -> (the unsigned integer of the same width, the exponent bits).
# A value is NaN or Inf exactly when all of its exponent bits are set (IEEE 754; bfloat16 is the top
# half of a float32; float8 e4m3 has no Inf and its NaN is S.1111.111, e5m2 is IEEE-like).
FLOAT_DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("<u8", 0x7FF0000000000000),
    "F32": ("<u4", 0x7F800000),
    "F16": ("<u2", 0x7C00),
    "BF16": ("<u2", 0x7F80),
    "F8_E5M2": ("u1", 0x7C),
    "F8_E4M3": ("u1", 0x7F),
}
SCAN_BUDGET_BYTES = 256 * MIB
"""Bytes of tensor data `nonfinite_tensors` reads: checkpoints up to this size are scanned whole."""
SCAN_BLOCK_BYTES = 64 * 2**10
"""Larger checkpoints: each tensor contributes evenly spaced blocks of this size (at least one)."""
_SLICE = 16 * MIB  # bytes tested at a time, so the scan's temporary arrays stay small


@dataclass(frozen=True)
class TensorEntry:
    name: str
    path: Path
    dtype: str
    start: int
    """Absolute offset of the tensor's first byte in the file."""
    nbytes: int


def tensor_entries(files: list[Path]) -> dict[str, TensorEntry]:
    """Tensor name -> dtype and byte range, from the safetensors headers (8 bytes little-endian
    header length, then a JSON object {name: {dtype, shape, data_offsets: [begin, end]}} whose offsets
    count from the end of the header). Call after `read_headers` accepted the files."""
    out: dict[str, TensorEntry] = {}
    for path in files:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            out[name] = TensorEntry(name, path, info["dtype"], 8 + n + begin, end - begin)
    return out


def _sample(nbytes: int, share: int, itemsize: int) -> list[tuple[int, int]]:
    """(offset, length) ranges of a tensor to read: all of it when `share` covers it, else evenly
    spaced blocks (the first and the last included), aligned to whole elements."""
    block = max(itemsize, SCAN_BLOCK_BYTES // itemsize * itemsize)
    if share >= nbytes or nbytes <= block:
        return [(0, nbytes)]
    k = max(1, share // block)
    last = (nbytes - block) // itemsize
    starts = sorted({(last * i // max(1, k - 1)) * itemsize for i in range(k)})
    return [(a, block) for a in starts]


def nonfinite_tensors(entries: list[TensorEntry], *, budget: int = SCAN_BUDGET_BYTES) -> tuple[list[str], int, int]:
    """(names of the tensors holding NaN or Inf, bytes scanned, bytes in total) for floating-point
    entries, testing exponent bits on the raw bytes with numpy (no torch).

    Budget: when the tensors hold at most `budget` bytes (256 MiB), every value is tested. Beyond,
    each tensor gets a share of the budget proportional to its size, read as evenly spaced 64 KiB
    blocks (always its first and last block, at least one per tensor): the same bytes on every run,
    about `budget` bytes in all, so a published 8 GB checkpoint is checked in about a second. A
    checkpoint that diverged is NaN almost everywhere and is found; a single bad value in a large
    tensor may not be. The blocks are read with seek + readinto rather than a memory map: on a file
    that is not in the page cache, faulting a map in page by page was 25x slower here."""
    import numpy as np  # lazy: numpy only for a checkpoint that is loaded

    entries = [e for e in entries if e.dtype in FLOAT_DTYPES and e.nbytes > 0]
    total = sum(e.nbytes for e in entries)
    scanned, bad = 0, []
    buffer = bytearray(min(_SLICE, max((e.nbytes for e in entries), default=0)))
    files: dict[Path, io.FileIO] = {}
    try:
        for e in entries:
            word, mask = FLOAT_DTYPES[e.dtype]
            itemsize = np.dtype(word).itemsize
            share = e.nbytes if total <= budget else budget * e.nbytes // total
            f = files.get(e.path)
            if f is None:
                f = files[e.path] = open(e.path, "rb", buffering=0)
            found = False
            for offset, length in _sample(e.nbytes, share, itemsize):
                for a in range(offset, offset + length, _SLICE):
                    n = min(offset + length, a + _SLICE) - a
                    view = memoryview(buffer)[:n]
                    f.seek(e.start + a)
                    if f.readinto(view) != n:
                        raise ValueError(f"{e.path.name}: tensor {e.name} ends after the end of the file")
                    values = np.frombuffer(view, dtype=word)
                    scanned += n
                    if np.any((values & mask) == mask):
                        found = True
                        break
                if found:
                    break
            if found:
                bad.append(e.name)
    finally:
        for f in files.values():
            f.close()
    return bad, scanned, total

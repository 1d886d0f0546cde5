"""What a run writes into its directory, against the free space of the directory's file system."""

from __future__ import annotations

import shutil
from pathlib import Path

from qwen3exp.errors import Problem


def disk_problem(key: str, path: Path, need_bytes: int) -> Problem | None:
    """Too little free space on `path`'s file system for what the run will write."""
    p = Path(path).absolute()
    while not p.exists() and p.parent != p:
        p = p.parent
    try:
        free = shutil.disk_usage(p).free
    except OSError:
        return None
    if free >= need_bytes:
        return None
    return Problem(
        key,
        str(path),
        f"its file system has {_size(free)} free but the run writes about "
        f"{_size(need_bytes)} (logs, metrics and, when on, checkpoints and exports)",
        f"a file system with at least {_size(need_bytes)} free",
        "free some space, or choose hydra.run.dir=... on another disk",
    )


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


_STATE_BYTES_PER_PARAM = 4 + 8
"""A DCP checkpoint holds float32 weights plus AdamW's two float32 moments per parameter."""
_EXPORT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_BASE_BYTES = 32 << 20
"""Logs, metrics, TensorBoard events, the resolved files: a few MiB for a short run; 32 MiB of room."""


def estimate_bytes(exp, total_params: int) -> int:
    """What a run writes into its directory, from the plan's parameter count."""
    need = _BASE_BYTES
    c = exp.checkpoint
    if c.save:
        saves = exp.training.steps // c.interval + 1
        kept = saves if c.keep_latest_k == 0 else min(saves, c.keep_latest_k + 1)  # the newest may be written first
        need += kept * total_params * _STATE_BYTES_PER_PARAM
    if c.exports:
        exports = 1 + (exp.training.steps // c.every_export if c.every_export else 0)
        # A LoRA export of a named Hugging Face base holds the adapter on its own (megabytes), no base copy.
        copies = (0 if exp.peft.kind == "lora" and c.loads_weights else 1) + (1 if c.merge_lora else 0)
        need += exports * total_params * _EXPORT_BYTES[c.dtype] * copies
    return need
